"""The heartbeat delivery ledger, the auth profile state and the usage ledger on both
storage backends (issue 15): what one process stored, the next one reads; a corrupt
ledger disables only itself and its bytes are kept; on PostgreSQL a write made while the
table is unusable is retried until it lands."""

from __future__ import annotations

import asyncio

from runtime.clock import FakeClock
from runtime.providers.failover.state import AuthState
from runtime.usage.ledger import UsageLedger
from scheduler.heartbeat.rules import DeliveryDeduper

ALERT = "ALERT: disk / is 95% full"


def _landed(store) -> None:
    """PostgreSQL writes leave the caller at once: wait until they are in."""
    for attr in ("wait_written", "close"):
        if hasattr(store, attr) and hasattr(store, "bridge"):
            getattr(store, attr)()
            return


async def _ledger(backend, clock, problems=None) -> DeliveryDeduper:
    records = await backend.records("heartbeat_ledger")
    return DeliveryDeduper(clock, path=backend.tmp / "heartbeat" / "delivered.json",
                           problems=problems, records=records)


async def test_heartbeat_ledger_survives_a_restart(backend):
    clock = FakeClock()
    first = await _ledger(backend, clock)
    first.record("main", ALERT)
    await asyncio.to_thread(_landed, first._store)
    again = await _ledger(backend, clock)  # a new process
    assert again.seen("main", "  ALERT:  disk / is 95% full ")
    assert not again.seen("ops", ALERT)


async def test_a_corrupt_heartbeat_ledger_is_kept_aside_and_starts_empty(backend):
    clock = FakeClock()
    first = await _ledger(backend, clock)
    first.record("main", ALERT)
    await asyncio.to_thread(_landed, first._store)
    if backend.name == "embedded":
        (backend.tmp / "heartbeat" / "delivered.json").write_text("[[broken")
    else:
        await backend.raw("UPDATE state_documents SET body = '[[broken'")
    problems: list[str] = []
    again = await _ledger(backend, clock, problems)
    assert not again.seen("main", ALERT) and len(problems) == 1
    assert "heartbeat alert ledger" in problems[0]
    if backend.name == "embedded":
        kept = [p.name for p in (backend.tmp / "heartbeat").iterdir() if ".corrupt-" in p.name]
    else:
        kept = [r[0] for r in await backend.raw(
            "SELECT name FROM state_documents WHERE body = '[[broken' AND name <> "
            "'heartbeat/delivered.json'")]
    assert len(kept) == 1 and ".corrupt-" in kept[0]
    again.record("main", "another alert")  # the ledger goes on, fresh
    await asyncio.to_thread(_landed, again._store)
    assert (await _ledger(backend, clock)).seen("main", "another alert")


async def test_auth_profile_cooldowns_survive_a_restart(backend):
    clock = FakeClock()
    records = await backend.records("auth_state")
    state = AuthState(backend.tmp / "auth-state.json", records).load()
    state.failure("openai", "key1", "rate_limit", clock.time(), cooldown=300)
    state.success("openai", "key2", clock.time())
    await asyncio.to_thread(_landed, state.store)
    again = AuthState(backend.tmp / "auth-state.json",
                      await backend.records("auth_state")).load()
    assert again.problem is None
    assert again.profile("openai", "key1").cooldown_until == clock.time() + 300
    assert again.last_good("openai") == "key2"


async def test_usage_ledger_records_read_back_in_order(backend):
    clock = FakeClock()
    ledger = await backend.records("usage") or UsageLedger(backend.tmp / "usage")
    for i in range(3):
        ledger.append({"agent": "main", "input": i, "cost_usd": 0.5}, clock.time() + i)
    await asyncio.to_thread(ledger.close)
    reader = await backend.records("usage") or UsageLedger(backend.tmp / "usage")
    recs = list(await asyncio.to_thread(lambda: list(reader.records(since=clock.time() + 1))))
    assert [(r["input"], r["_t"]) for r in recs] == [(1, clock.time() + 1),
                                                      (2, clock.time() + 2)]
    assert recs[0]["ts"] == "2026-01-01T00:00:01.000Z"


async def test_usage_written_while_the_table_is_unusable_lands_later(pg_dsn, tmp_path):
    from tests.storage_backends import PostgresBackend
    backend = PostgresBackend(pg_dsn)
    backend.tmp = tmp_path
    ledger = await backend.records("usage")
    await backend.raw("ALTER TABLE usage_records RENAME TO usage_away")
    ledger.append({"agent": "main", "input": 7}, 1_767_225_600.0)  # returns at once
    await asyncio.sleep(1.5)  # one failed attempt and its retry wait
    assert await backend.raw("SELECT count(*) FROM usage_away") == [(0,)]
    await backend.raw("ALTER TABLE usage_away RENAME TO usage_records")
    await asyncio.to_thread(ledger.close)  # waits for the retry to land
    rows = await backend.raw("SELECT record FROM usage_records")
    assert len(rows) == 1 and '"input":7' in rows[0][0]
    await backend.close()


async def test_replicas_share_the_heartbeat_ledger(pg_dsn, tmp_path):
    """Two replicas, one ledger row: an alert one delivered is not repeated by the
    other, and neither write drops the other's entries."""
    from tests.storage_backends import PostgresBackend
    backend = PostgresBackend(pg_dsn)
    backend.tmp = tmp_path
    clock = FakeClock()
    a, b = await _ledger(backend, clock), await _ledger(backend, clock)
    a.record("main", ALERT)
    await asyncio.to_thread(_landed, a._store)
    assert await asyncio.to_thread(b.seen, "main", ALERT)
    await asyncio.to_thread(b.record, "main", "another alert")
    await asyncio.to_thread(_landed, b._store)
    fresh = await _ledger(backend, clock)
    assert fresh.seen("main", ALERT) and fresh.seen("main", "another alert")
    await backend.close()
