"""A cron run that waits for its session's lane on a replica that is then paused past the
lease TTL (gateway/cluster/synthetic.py ``still_due``, gateway/cluster/occurrences.py
``guard``): another replica takes the occurrence over and runs it; when the paused one
comes back and finally gets the lane, it must not run the occurrence a second time. Seen
with bench/cluster_checker.py, seed 303: due time 07.841 run by r3's retry at 10.43 and
by r2's original run, still waiting for the lane, at 15.66 (``cron-twice``). On a real
PostgreSQL; the lane is polled (synthetic.POLL), nothing else waits."""

from __future__ import annotations

import asyncio

from gateway.cluster import membership
from gateway.cluster.occurrences import CronLedger
from gateway.cluster.synthetic import SyntheticTurns, take
from gateway.cluster.work import ClusterWork
from gateway.turns.work import SyntheticWork
from tests import cluster_harness

TTL = 3.0
KEY = "agent:main:cron:job1"
DUE = 1_767_225_600.0

dbs = cluster_harness.replica_dbs  # fixture
_pause = cluster_harness.pause


def _work(db, name: str) -> ClusterWork:
    return ClusterWork(db, name, TTL, None, side_effecting=lambda t: False,
                       debounce=lambda *a: 0)


async def test_a_cron_run_taken_over_while_it_waited_for_its_lane_does_not_run(dbs):
    r1, r2 = dbs["r1"], dbs["r2"]
    l1, l2 = CronLedger(r1, "r1", TTL), CronLedger(r2, "r2", TTL)
    w1, w2 = _work(r1, "r1"), _work(r2, "r2")
    assert await l1.claim("job1", DUE) is None  # r1 runs this due time ...
    guard = l1.guard("job1", DUE)
    assert guard is not None and await guard() and l1.guard("job1", None) is None
    assert (await r2.run(lambda c: take(c, w2, KEY))).holder == "r2"  # ... r2 has the lane
    fut = SyntheticTurns(w1).submit(KEY, SyntheticWork(agent_id="main", trigger="cron",
                                                       prompt="tick", still_due=guard), {})
    await _pause(r1, "r1")  # r1 stalls past the TTL while it waits
    assert await l2.orphans() == [("job1", DUE)]  # r2 retries the occurrence itself
    await r2.run(lambda c: c.execute("DELETE FROM cluster_leases WHERE name = $1",
                                     "lane:" + KEY))  # and gives the lane back
    await r1.run(lambda c: membership.beat(c, "r1", None))  # r1 is back, gets the lane
    result = await asyncio.wait_for(fut, 10)  # (w1 has no local lanes: it must not run)
    assert (result.status, result.error) == ("skipped", "taken over by another replica")
    assert not await guard()
    await asyncio.wait_for(w1.close(), 10)
