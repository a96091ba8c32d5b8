"""A slow PostgreSQL never stalls the event loop (issue 15): a read or write of the
gateway that has to wait for the database — the first load of a session's transcript,
a cron save or run-log line, a usage report, an inbound message's dedupe check — waits
off the loop, so every other session's turn goes on meanwhile.

How: a second connection takes a table lock that makes the gateway's statement wait;
a watcher thread waits until PostgreSQL shows that statement waiting for the lock
(``pg_stat_activity``), then until the gateway's loop has ticked on 50 more times (an
asyncio task counting its turns) — or gives up after 10 s — and releases the lock. A
blocked loop makes no ticks: the test fails naming the wait."""

from __future__ import annotations

import asyncio
import threading
import time

import asyncpg
import pytest

from tests.helpers import base_config, running_gateway

TICKS = 50  # loop iterations the gateway must make while its statement waits


class LockHolder(threading.Thread):
    """Holds ``lock_sql`` in a transaction on its own connection (own loop, own thread)
    until the gateway's statement waits for it and ``ticks()`` grew by TICKS (or 10 s)."""

    def __init__(self, dsn: str, lock_sql: str, ticks) -> None:
        super().__init__(daemon=True)
        self.dsn, self.lock_sql, self.ticks = dsn, lock_sql, ticks
        self.locked = threading.Event()
        self.waited = False  # PostgreSQL showed a statement waiting for our lock
        self.progress: int | None = None  # loop ticks made while it waited

    def run(self) -> None:
        asyncio.run(self._hold())

    async def _hold(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            tr = conn.transaction()
            await tr.start()
            await conn.execute(self.lock_sql)
            self.locked.set()
            end = time.monotonic() + 10
            while not self.waited and time.monotonic() < end:
                self.waited = bool(await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"))
            start = self.ticks()
            while self.ticks() - start < TICKS and time.monotonic() < end:
                await asyncio.sleep(0.01)  # polling an observable, bounded by `end`
            self.progress = self.ticks() - start
            await tr.rollback()
        finally:
            await conn.close()


async def _while_locked(dsn: str, lock_sql: str, action) -> object:
    """Run ``action()`` on the loop while ``lock_sql`` is held; returns its result after
    asserting that the loop kept ticking while the statement waited."""
    ticks = 0

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)
    beat = asyncio.ensure_future(heartbeat())
    holder = LockHolder(dsn, lock_sql, lambda: ticks)
    holder.start()
    try:
        await asyncio.to_thread(holder.locked.wait, 10)
        result = await asyncio.wait_for(action(), 30)
        await asyncio.to_thread(holder.join, 15)
    finally:
        beat.cancel()
    assert holder.waited, "the gateway's statement never waited for the lock"
    assert holder.progress is not None and holder.progress >= TICKS, (
        f"the event loop made {holder.progress} ticks while PostgreSQL made the gateway "
        "wait: a blocking call on the loop")
    return result


@pytest.fixture
async def pg_gateway(tmp_path, pg_dsn):
    cfg = base_config(tmp_path / "state", storage={"backend": "postgres", "dsn": pg_dsn})
    async with running_gateway(cfg) as gw:
        yield gw


async def test_first_load_of_a_session_waits_off_the_loop(pg_gateway, pg_dsn):
    gw = pg_gateway
    first = await gw.local.submit("hello", to="a", channel="t").future
    assert first.status == "ok"

    async def new_session_turn():
        return await gw.local.submit("hi there", to="b", channel="t").future
    res = await _while_locked(pg_dsn, "LOCK TABLE transcript_lines IN ACCESS EXCLUSIVE MODE",
                              new_session_turn)
    assert res.status == "ok" and "hi there" in res.text


async def test_usage_report_waits_off_the_loop(pg_gateway, pg_dsn):
    gw = pg_gateway
    assert (await gw.local.submit("hello", to="a", channel="t").future).status == "ok"

    async def usage_command():
        return await gw.local.submit("/usage", to="a", channel="t").future
    res = await _while_locked(pg_dsn, "LOCK TABLE usage_records IN ACCESS EXCLUSIVE MODE",
                              usage_command)
    assert res.status == "ok" and res.text.startswith("Usage today: this session")


async def test_cron_save_waits_off_the_loop(pg_gateway, pg_dsn):
    from scheduler.cron.job import new_job
    cron = pg_gateway.scheduling.cron
    job = new_job(name="daily", schedule={"kind": "cron", "expr": "0 9 * * *"},
                  message="standup", now=pg_gateway.clock.time())
    added = await _while_locked(pg_dsn, "LOCK TABLE cron_jobs IN EXCLUSIVE MODE",
                                lambda: cron.add(job))
    assert added.id == job.id
    (count,) = (await _rows(pg_dsn, "SELECT count(*) FROM cron_jobs WHERE NOT removed"))[0]
    assert count == 1


async def test_cron_run_log_waits_off_the_loop(pg_gateway, pg_dsn):
    """A finished run's log line is queued, not written on the loop; reading the runs
    afterwards finds it."""
    from scheduler.cron.job import new_job
    cron = pg_gateway.scheduling.cron
    job = await cron.add(new_job(name="ping", schedule={"kind": "every", "interval": 3600},
                                 message="ping", now=pg_gateway.clock.time()))
    outcome = await _while_locked(pg_dsn, "LOCK TABLE cron_runs IN ACCESS EXCLUSIVE MODE",
                                  lambda: cron.run_now(job.id))
    runs = await cron.runs(job.id)
    assert [(r["status"], r["manual"]) for r in runs] == [(outcome.status, True)]


async def test_inbound_dedupe_waits_off_the_loop(pg_gateway, pg_dsn, monkeypatch):
    """A platform message's "seen before?" check (the inbound_seen unique key) is awaited
    by intake; a redelivery of it afterwards is still dropped. (The check's own 2 s limit
    is lifted here: a loop blocked for 2 s would otherwise resume before the watcher
    gives up.)"""
    from channels.base import InboundMessage
    from runtime.storage.postgres import dedupe
    monkeypatch.setattr(dedupe, "TIMEOUT", 30.0)
    msg = InboundMessage(channel="telegram", account_id="default", chat_type="dm",
                         peer_id="42", sender_id="42", text="hello", message_id="100")
    outcome = await _while_locked(pg_dsn, "LOCK TABLE inbound_seen IN ACCESS EXCLUSIVE MODE",
                                  lambda: pg_gateway.intake.on_message(msg))
    assert outcome != "duplicate"
    assert await pg_gateway.intake.on_message(msg) == "duplicate"


async def test_pairing_signature_is_refreshed_off_the_loop(pg_gateway, pg_dsn, monkeypatch):
    """The pairing check of every inbound DM (``is_approved`` -> ``signature``): once a
    channel's signature is known, a due refresh runs on the bridge's loop and the known
    answer is given at once. (The hot path's 2 s limit is lifted here, as for dedupe.)"""
    from gateway.service.storage import bridge
    from runtime.storage.postgres import pairing
    from runtime.storage.postgres.pairing import PgPairingRecords
    monkeypatch.setattr(pairing, "TIMEOUT", 30.0)
    records = PgPairingRecords(bridge(pg_gateway))
    assert records.signature("telegram") is None  # the first look asks the database
    monkeypatch.setattr(pairing, "REFRESH", 0.0)  # from now on every look is due

    async def check():
        return records.signature("telegram")
    assert await _while_locked(pg_dsn, "LOCK TABLE pairing IN ACCESS EXCLUSIVE MODE",
                               check) is None


async def test_serving_makes_no_blocking_database_call_on_the_loop(pg_gateway):
    """Once the gateway serves, a round of everyday work — new and known sessions' turns,
    /usage, /status, a cron job added, run and its runs read, a platform message and its
    redelivery, a pairing check — makes no blocking bridge call from the event loop
    (``SyncBridge.loop_calls``, each one also a ``pg_bridge_call_on_event_loop`` debug
    line naming its caller)."""
    from channels.base import InboundMessage
    from gateway.service.storage import bridge
    from runtime.storage.postgres.pairing import PgPairingRecords
    from scheduler.cron.job import new_job
    gw = pg_gateway
    door = bridge(gw)
    before = door.loop_calls
    for to, text in (("a", "hello"), ("b", "hi"), ("a", "again"), ("a", "/usage")):
        assert (await gw.local.submit(text, to=to, channel="t").future).status == "ok"
    gw.status()
    cron = gw.scheduling.cron
    job = await cron.add(new_job(name="ping", schedule={"kind": "every", "interval": 3600},
                                 message="ping", now=gw.clock.time()))
    await cron.run_now(job.id)
    assert len(await cron.runs(job.id)) == 1
    msg = InboundMessage(channel="telegram", account_id="default", chat_type="dm",
                         peer_id="7", sender_id="7", text="yo", message_id="5")
    assert await gw.intake.on_message(msg) != "duplicate"
    assert await gw.intake.on_message(msg) == "duplicate"
    PgPairingRecords(door).signature("telegram")  # the first look at a channel may wait
    assert door.loop_calls == before + 1, "blocking PostgreSQL calls on the event loop"


async def _rows(dsn: str, sql: str) -> list[tuple]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()
