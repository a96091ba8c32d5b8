"""PostgreSQL restarted twice under a running gateway, its close reaching the gateway late.

A restart ends every backend with ``FATAL: terminating connection``; until the socket's
close arrives, asyncpg holds a pooled connection that has read that error yet looks open,
and the next statement on it raises ``InternalClientError`` ("cannot switch to state 11;
another operation (2) is in progress"), not a connection error. The proxy in front of
PostgreSQL (tests/pg_proxy.py) makes that window a second long, so every store meets it.

After each restart the gateway answers the message sent during the outage and the next
one; nothing it stored is missing afterwards (the usage ledger's write-behind keeps
writing, each turn's transcript lines are in); and its event loop never stood still for
a second (a heartbeat task's longest gap between wake-ups, measured, not slept).

A transcript read off the event loop (a turn's preload, a resumed turn's look-up, in a
worker thread) waits out the outage as the turn's writes do; on the loop it fails at once.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from runtime.storage.config import StorageSection
from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import open_database
from runtime.storage.postgres.transcripts import PgTranscripts
from tests import cluster_harness
from tests.helpers import base_config, running_gateway
from tests.pg_proxy import LingerProxy

pg, dsn = cluster_harness.pg, cluster_harness.dsn  # a private server: the test stops it
LINGER = 1.0  # seconds between the server's close and the gateway seeing it
RESTARTS = 2


class Heartbeat:
    """The longest gap (s) between wake-ups of a task asking to wake every 20 ms."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task | None = None

    async def _beat(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.02)
            now = time.monotonic()
            self.worst = max(self.worst, now - last)
            last = now

    def __enter__(self) -> Heartbeat:
        self._task = asyncio.ensure_future(self._beat())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


@pytest.fixture
def proxy(pg):
    p = LingerProxy(lambda: pg.port).start()
    yield p
    p.close()


async def test_two_restarts_lose_nothing_and_never_stall_the_loop(tmp_path, fake_model, pg,
                                                                   dsn, proxy):
    cfg = base_config(tmp_path / "state", fake_model.base_url, storage={
        "backend": "postgres", "dsn": proxy.dsn(dsn), "pool": {"connect_timeout": "2s"}})
    sent = 0

    async def ask(gw, to: str):
        nonlocal sent
        sent += 1
        return gw.local.submit(f"message {sent}", to=to, channel="t").future

    async with running_gateway(cfg) as gw:
        with Heartbeat() as beat:
            assert (await asyncio.wait_for(await ask(gw, "a"), 10)).status == "ok"
            proxy.linger = LINGER
            for i in range(RESTARTS):
                await asyncio.to_thread(pg.stop)
                during = await ask(gw, f"down{i}")  # meets the half-closed connections
                await asyncio.to_thread(pg.start)
                res = await asyncio.wait_for(during, 30)
                assert res.status == "ok", f"restart {i + 1}: {res.status} {res.text!r}"
                res = await asyncio.wait_for(await ask(gw, "a"), 30)
                assert res.status == "ok", f"after restart {i + 1}: {res.status} {res.text!r}"
    assert proxy.closed_late >= RESTARTS  # the fault was injected each time
    assert beat.worst < 1.0, f"the event loop stood still for {beat.worst:.2f}s"
    rows = await cluster_harness.pg_query(dsn, "SELECT count(*) FROM usage_records")
    assert rows == [(sent,)], "usage records lost: the ledger's writer stopped"
    lines = await cluster_harness.pg_query(
        dsn, "SELECT count(*) FILTER (WHERE line::jsonb->>'type' = 'message') "
             "FROM transcript_lines")
    assert lines == [(2 * sent,)], "transcript lines lost"


async def test_a_transcript_read_off_the_loop_waits_out_a_restart(pg, dsn):
    await (await open_database(StorageSection(backend="postgres", dsn=dsn))).close()
    door = SyncBridge(dsn, timeout=2.0)
    store = PgTranscripts(door)
    try:
        store.ensure_agent("main")
        await asyncio.to_thread(pg.stop)
        try:
            with pytest.raises(OSError):  # on the loop: at once, never a wait there
                list(store.entries_reversed("main", "s1"))
            reader = asyncio.ensure_future(asyncio.to_thread(
                lambda: list(store.entries_reversed("main", "s1"))))
            await cluster_harness.until(lambda: store.stats.retries > 0,
                                        "the read in a worker thread met the outage")
            assert not reader.done()
        finally:
            await asyncio.to_thread(pg.start)
        assert await asyncio.wait_for(reader, 30) == []
    finally:
        door.close()
