"""``tidegate sessions outcomes`` on replicas reads the shared timeline's ``OUTCOME``
events (gateway/cluster/shared_outcomes.py): a message has one outcome, the first
recorded, even when a second event names the same entry (the timeline is append-only: a
re-run message's second event cannot be taken back). Real PostgreSQL."""

from __future__ import annotations

from gateway.cluster.db import ClusterDB
from gateway.cluster.shared_outcomes import select
from runtime.clock import FakeClock
from runtime.storage.config import StorageSection
from runtime.storage.postgres.pool import open_database
from runtime.timeline import Timeline

KEY = "agent:main:webchat:dm:fi-m84"


def _outcome(outcome: str, entry: str | None, detail: str = "") -> dict:
    return {"outcome": outcome, "detail": detail, "message_id": None, "channel": "webchat",
            "entry_id": entry, "run_id": "r" + (entry or "x")}


async def test_the_listing_keeps_the_first_outcome_of_an_entry(pg_dsn):
    pool = await open_database(StorageSection(backend="postgres", dsn=pg_dsn))
    clock = FakeClock(start=1_800_000_000.0)
    timeline = await Timeline.open_postgres(pool, clock=clock)
    db = ClusterDB(pg_dsn)
    try:
        await timeline.init_timeline("s1", KEY)
        for outcome, entry, detail in (("replied", "53", ""), ("silent", "54", ""),
                                       ("replied", "53", "re-run after a restart"),
                                       ("failed", None, "no entry"),
                                       ("failed", None, "no entry either")):
            await clock.advance(1.0)
            await timeline.append_event("s1", "OUTCOME", _outcome(outcome, entry, detail))
        rows = await select(db, None, None, None)
        assert len(rows) == 4  # one row per entry; the two without an entry: their own
        assert [(r["id"], r["outcome"], r["detail"]) for r in rows][:2] == [
            ("53", "replied", ""), ("54", "silent", "")]
        assert [r["detail"] for r in rows[2:]] == ["no entry", "no entry either"]  # own ids
        # a window that starts after the first: the later one is the entry's only row there
        assert [r["id"] for r in await select(db, KEY, clock.time() - 3.5, None)] == \
            ["54", "53"] + [r["id"] for r in rows[2:]]
    finally:
        await timeline.close()
        await db.close()
        await pool.close()
