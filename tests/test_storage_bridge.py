"""The PostgreSQL bridge's waits are bounded and a caller that stops waiting lets go
(runtime/storage/postgres/bridge.py), against a real PostgreSQL: a blocking call that
times out cancels its statement, so the pooled connection serves the next call at once
(an abandoned statement would keep it, and a few of them every connection, for good);
a cancel that reaches ``acall`` together with its result still cancels the caller."""

from __future__ import annotations

import asyncio
import threading

import asyncpg
import pytest

from runtime.storage.postgres.bridge import SyncBridge
from tests.cluster_harness import pg_query


@pytest.fixture
def bridge(pg_dsn):
    door = SyncBridge(pg_dsn, max_size=1, timeout=2.0)  # one connection: no spare
    yield door
    door.close()


async def _locked(dsn: str, ready: asyncio.Event, release: asyncio.Event) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
            ready.set()
            await release.wait()
    finally:
        await conn.close()


async def test_a_call_that_times_out_gives_its_connection_back(pg_dsn, bridge):
    await pg_query(pg_dsn, "CREATE TABLE t (x int)")
    ready, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.ensure_future(_locked(pg_dsn, ready, release))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        with pytest.raises(TimeoutError):  # waits for the lock: given up after 0.5 s
            await asyncio.to_thread(bridge.call, lambda c: c.fetchval(
                "SELECT count(*) FROM t"), 0.5)
        # the lock is still held: only a cancelled statement frees the one connection
        assert await asyncio.to_thread(bridge.call, lambda c: c.fetchval("SELECT 1"),
                                       5.0) == 1
        assert await _lock_waiters(pg_dsn) == 0, "the abandoned statement still waits"
    finally:
        release.set()
        await holder


async def _lock_waiters(dsn: str) -> int:
    rows = await pg_query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE "
                               "wait_event_type = 'Lock' AND datname = current_database()")
    return rows[0][0]


async def test_a_cancel_arriving_with_the_result_is_not_lost(bridge):
    delivered = threading.Event()

    async def answer(conn: asyncpg.Connection) -> int:
        # set once the bridge's task has handed its result to the caller's loop (its
        # done callbacks run in order: the hand-over first)
        asyncio.current_task().add_done_callback(lambda _t: delivered.set())
        return await conn.fetchval("SELECT 7")

    task = asyncio.ensure_future(bridge.acall(answer, timeout=10))
    await asyncio.sleep(0)  # the call is on its way
    # This loop is held (a blocking wait, on purpose) until the result is queued for it;
    # the cancel then joins the same pass of the loop, as a /stop or a shutdown can.
    assert delivered.wait(10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
