"""A message steered into a running turn joins the turn's journal entries on both
storages: the side-effecting tools and taint that already ran are its too, and every
later mark (a tool began, the turn was tainted) reaches the turn's original entries as
well as the steered one. Before, the PostgreSQL journal replaced the turn's rows by the
steered row, so later tool marks missed the original rows (a death in that tool was then
charged as a plain ``turn`` to them: gateway/cluster/crashes.py). With embedded storage
(the intake journal file), a steered entry joining a resumed turn takes only the tools of
that turn's current attempt, not those of the attempt the process died in."""

from __future__ import annotations

import asyncpg

from gateway.cluster import crashes
from gateway.cluster.db import ClusterDB
from gateway.cluster.journal import WorkJournal
from gateway.journal.store import FILE_NAME, IntakeJournal
from gateway.journal.tracking import JournalTracker
from gateway.turns.work import UserWork
from runtime.clock import FakeClock
from runtime.events import RuntimeEvent
from runtime.storage.config import StorageSection
from runtime.storage.postgres.pool import open_database

KEY = "agent:main:telegram:dm:7"


class _Journal(WorkJournal):
    """The journal side of a replica alone (no lanes: the rows are accepted, not run)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.held: dict[str, float] = {}

    def lane_lost(self, key: str) -> None:
        pass


def _work(text: str) -> UserWork:
    return UserWork(agent_id="main", text=text, channel="telegram", sender_id="7")


async def _rows(dsn: str, ids: list[int]) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(
            "SELECT id, tools, taint, run_id, attempts, attempts_seen, attempt_from, "
            "replying FROM cluster_work WHERE id = ANY($1::bigint[]) ORDER BY id", ids))
    finally:
        await conn.close()


async def test_a_steered_row_shares_the_turns_tool_and_taint_marks(pg_dsn):
    await (await open_database(StorageSection(backend="postgres", dsn=pg_dsn))).close()
    db = ClusterDB(pg_dsn)
    journal = _Journal(db, "r1", side_effecting=lambda tool: tool != "read")
    try:
        first, steered = _work("start"), _work("actually, use metric units")
        for n, w in enumerate((first, steered)):
            assert await journal.accept(KEY, w, f"telegram:{n}")
        run = first.run_id
        assert await journal.turn_started(run, [first]) is None
        await journal.tool_began(run, "exec")
        await journal.tainted(run, "web_fetch of https://example.com")
        await journal.turn_started(run, [steered])  # the executor's take_steered
        await journal.tool_began(run, "message")
        await journal.tainted(run, "read of inbox.md")
        await journal.close()
        ids = [int(first.journal_id), int(steered.journal_id)]
        rows = await _rows(pg_dsn, ids)
        assert [list(r["tools"]) for r in rows] == [["exec", "message"]] * 2
        assert [list(r["taint"]) for r in rows] == [
            ["web_fetch of https://example.com", "read of inbox.md"]] * 2
        assert {r["run_id"] for r in rows} == {run}
        # a death now is charged to both rows, as the tool they were both in
        assert crashes.charged(rows) == set(ids)
        assert {crashes.attempt_signature(r) for r in rows} == {"tool:message"}
    finally:
        await db.close()


def _tool(run: str, tool: str) -> RuntimeEvent:
    return RuntimeEvent(type="tool_run_start", run_id=run, session_key=KEY,
                        agent_id="main", ts=0.0, data={"tool": tool})


def test_a_steered_entry_shares_the_turns_marks_in_the_journal_file(tmp_path):
    path = tmp_path / FILE_NAME
    journal = IntakeJournal(path, FakeClock(1_000.0), fsync=False)
    journal.load()
    first = journal.accept(KEY, {"agent_id": "main", "text": "start"})
    journal.started([first.id], "run-1")
    journal.tool_began("run-1", "exec")  # the attempt the process dies in
    journal.close()
    journal = IntakeJournal(path, FakeClock(1_001.0), fsync=False)
    journal.load()
    tracker = JournalTracker(journal, side_effecting=lambda tool: tool != "read")
    steered = journal.accept(KEY, {"agent_id": "main", "text": "more"})
    a, b = _work("start"), _work("more")
    a.journal_id, b.journal_id = first.id, steered.id
    tracker.turn_started("run-2", [a])  # resumed after the death
    tracker.on_runtime_event(_tool("run-2", "write"))
    tracker.turn_started("run-2", [b])  # steered in
    tracker.on_runtime_event(_tool("run-2", "message"))
    live = {e.id: e for e in journal.unfinished()}
    assert live[first.id].attempt == ["write", "message"]
    assert live[steered.id].attempt == ["write", "message"]  # not the dead attempt's exec
    assert live[first.id].tools == ["exec", "write", "message"]
    journal.close()
    reloaded = {e.id: e for e in IntakeJournal(path, FakeClock(1_002.0)).load()}
    assert reloaded[steered.id].tools == ["write", "message"]
