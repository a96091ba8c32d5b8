"""A PostgreSQL outage is not a replica's death (gateway/cluster/db.py ``peer_ttl``): every
heartbeat goes stale while the database is down, so the replica that reconnects first
must not take over the accounts, lanes and turns of the others, which are still
reconnecting. A real PostgreSQL server that the test stops and starts; the end-to-end
reproduction with real replicas is bench/cluster_outage_repro.py."""

from __future__ import annotations

import asyncio

import pytest

from gateway.cluster import membership
from gateway.cluster.db import ClusterDB, ClusterUnavailable
from gateway.cluster.work import ClusterWork
from gateway.turns.work import UserWork
from runtime.clock import FakeClock
from runtime.storage.config import StorageSection
from runtime.storage.postgres.pool import open_database
from tests import cluster_harness

TTL = 3.0
pg, dsn = cluster_harness.pg, cluster_harness.dsn  # fixtures (a private server: stopped)


async def test_the_replica_back_first_takes_nothing_over_for_a_ttl(pg, dsn):
    """Against a real server stopped and started: right after the outage r1's heartbeat
    is as stale as an hour-old one (``age``), yet r2 takes neither its turn nor its lane
    until it has itself been back for a TTL (the fake clock moves it on)."""
    await (await open_database(StorageSection(backend="postgres", dsn=dsn))).close()
    clock = FakeClock()
    r1, r2 = ClusterDB(dsn), ClusterDB(dsn, clock=clock)
    kw = {"side_effecting": lambda t: False, "debounce": lambda *a: 0}
    w1, w2 = ClusterWork(r1, "r1", TTL, None, **kw), ClusterWork(r2, "r2", TTL, None, **kw)
    try:
        for db, rid in ((r1, "r1"), (r2, "r2")):
            await db.run(lambda c, rid=rid: membership.beat(c, rid, None))
        work = UserWork(agent_id="main", text="hi", channel="telegram", account_id="bot0",
                        chat_type="dm", sender_id="1", message_id="42")
        key = "agent:main:telegram:dm:1"
        assert await w1.accept(key, work, "tg:1")
        assert await r1.run(lambda c: w1._assign(c, key, [int(work.journal_id)])) == "r1"
        await asyncio.to_thread(pg.stop)
        try:
            with pytest.raises(ClusterUnavailable):
                await r2.run(lambda c: c.fetchval("SELECT 1"))
        finally:
            await asyncio.to_thread(pg.start)
        await cluster_harness.pause(r2, "r1")  # r1 has not beaten since (reconnecting)
        assert r2.status()["state"] == "up"
        assert await w2.take_over() == 0
        other = UserWork(agent_id="main", text="next", channel="telegram",
                         account_id="bot0", chat_type="dm", sender_id="1", message_id="43")
        assert await w2.accept(key, other, "tg:2")
        assert await r2.run(lambda c: w2._assign(c, key, [int(other.journal_id)])) == "r1"
        await clock.advance(TTL)  # r1 stayed silent for a TTL while r2 was connected
        assert await w2.take_over() == 2
    finally:
        for w, db in ((w1, r1), (w2, r2)):
            await asyncio.wait_for(w.close(), 10)
            await db.close()


async def test_a_start_waits_for_postgres_with_backoff_then_opens(pg, dsn):
    """PostgreSQL down at start: each refused attempt is reported (``status`` shows it)
    and retried after 0.5, 1, 2 ... s on the clock, until the server is back; a database
    that does not exist is not waited for."""
    from runtime.storage.postgres.errors import StorageUnavailable
    from runtime.storage.postgres.wait import open_database_waiting
    section = StorageSection(backend="postgres", dsn=dsn, pool={"connect_timeout": 2})
    clock, states = FakeClock(), []
    await asyncio.to_thread(pg.stop)
    task = asyncio.ensure_future(open_database_waiting(section, clock=clock,
                                                       on_wait=states.append))
    try:
        for n in range(1, 4):
            await cluster_harness.until(lambda n=n: len(states) == n, what=f"attempt {n}")
            assert not task.done()
            await clock.advance(states[-1]["retry_in_s"])
        assert [s["retry_in_s"] for s in states[:3]] == [0.5, 1.0, 2.0]
        assert {s["waiting_for"] for s in states} == {"PostgreSQL"}
        assert "ConnectionRefusedError" in states[0]["last_error"] or \
            "OSError" in states[0]["last_error"]
    finally:
        await asyncio.to_thread(pg.start)
    await cluster_harness.until(lambda: len(states) == 4 or task.done(), what="attempt 4")
    while not task.done():
        await clock.advance(1.0)
        await asyncio.sleep(0.05)
    pool = await task
    await pool.close()
    assert states[-1] is None  # reached: the waiting state is cleared
    gone = StorageSection(backend="postgres", dsn=dsn.rsplit("/", 1)[0] + "/no_such_db")
    with pytest.raises(StorageUnavailable) as err:
        await asyncio.wait_for(open_database_waiting(gone, clock=clock), 10)
    assert not err.value.transient
