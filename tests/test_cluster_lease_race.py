"""The re-take race on a real PostgreSQL (issue 15 "Lanes"; gateway/cluster/membership.py
``acquire_fenced``, gateway/cluster/work.py ``take_over``): a replica presumed dead (its
heartbeat and its lease older than the TTL: the lease clock, database time, moved on)
wakes and re-takes its lane while a peer is in the middle of taking it over. Exactly one
of them may come out holding the lane, and rows still running on the one that kept it
must not be queued to run a second time. The interleavings are driven statement by
statement on separate connections; nothing sleeps."""

from __future__ import annotations

import asyncio

import asyncpg

from gateway.cluster import membership
from gateway.cluster.work import ClusterWork
from gateway.turns.work import UserWork
from tests import cluster_harness

TTL = 3.0
KEY = "agent:main:telegram:dm:1"
LANE = "lane:" + KEY

dbs = cluster_harness.replica_dbs  # fixture
age, pg_query = cluster_harness.age, cluster_harness.pg_query


async def _waiting_on_a_lock(probe: asyncpg.Connection, pid: int) -> None:
    """Until backend ``pid`` waits on a lock (pg_stat_activity), i.e. its statement has
    taken its snapshot and is blocked on the row."""
    while await probe.fetchval("SELECT wait_event_type FROM pg_stat_activity WHERE pid = "
                               "$1", pid) != "Lock":
        await asyncio.sleep(0)


async def test_a_takeover_whose_snapshot_predates_the_holders_wake_up_does_not_take_the_lane(
        dbs, pg_dsn):
    """r1 holds the lane, then looks dead (the lease clock moved past the TTL). It wakes:
    its heartbeat and its re-take of the lane commit while r2's takeover statement, whose
    snapshot still shows r1 dead, waits for the lease row. r2 must find r1 holding it."""
    r1_conn, r2_conn, probe = [await asyncpg.connect(pg_dsn) for _ in range(3)]
    try:
        holder, gen = await membership.acquire_fenced(r1_conn, LANE, "r1", TTL)
        assert holder == "r1"
        await age(r1_conn, "r1")
        wake = r1_conn.transaction()
        await wake.start()
        await membership.beat(r1_conn, "r1", None)  # r1 wakes: its heartbeat ...
        assert await membership.acquire_fenced(r1_conn, LANE, "r1", TTL) == ("r1", gen)
        takeover = asyncio.ensure_future(membership.acquire_fenced(r2_conn, LANE, "r2", TTL))
        await _waiting_on_a_lock(probe, r2_conn.get_server_pid())
        await wake.commit()  # ... and its re-take, committed while r2 waits for the row
        assert await asyncio.wait_for(takeover, 10) == ("r1", gen)
        assert await pg_query(pg_dsn, "SELECT replica_id, generation FROM cluster_leases") \
            == [("r1", gen)]
    finally:
        for conn in (r1_conn, r2_conn, probe):
            await conn.close()


def _work(journal_id: int | None = None) -> UserWork:
    return UserWork(agent_id="main", text="hi", channel="telegram", account_id="bot0",
                    chat_type="dm", sender_id="1",
                    journal_id=str(journal_id) if journal_id else None)


async def test_rows_of_a_replica_that_re_took_its_lane_are_not_run_twice(dbs, pg_dsn):
    """r1 runs a row, then looks dead; before r2's takeover tick it wakes and re-takes
    the lane for a new message (its heartbeat not yet written). r2's takeover sees the row
    orphaned but must leave both the lane and the row with r1: requeued, r1 would claim
    and run it a second time next to the turn it is still running."""
    r1, r2 = dbs["r1"], dbs["r2"]
    w1 = ClusterWork(r1, "r1", TTL, None, side_effecting=lambda t: False,
                     debounce=lambda *a: 0)
    w2 = ClusterWork(r2, "r2", TTL, None, side_effecting=lambda t: False,
                     debounce=lambda *a: 0)
    first, second = _work(), _work()
    assert await w1.accept(KEY, first, "tg:1") and await w1.accept(KEY, second, "tg:2")
    one, two = int(first.journal_id), int(second.journal_id)
    assert await r1.run(lambda c: w1._assign(c, KEY, [one])) == "r1"  # running on r1
    await cluster_harness.pause(r1, "r1")
    assert await r1.run(lambda c: w1._assign(c, KEY, [two])) == "r1"  # woke, re-took
    assert await w2.take_over() == 0
    rows = await pg_query(pg_dsn, "SELECT id, target, state FROM cluster_work ORDER BY id")
    assert rows == [(one, "r1", "running"), (two, "r1", "running")]
    assert await pg_query(pg_dsn, "SELECT name, replica_id FROM cluster_leases") == [
        (LANE, "r1")]
    assert (await r1.run(lambda c: w1._claim_rows(c, [])))[0] == []  # nothing queued to run again
    await asyncio.wait_for(w1.close(), 10)
    await asyncio.wait_for(w2.close(), 10)
