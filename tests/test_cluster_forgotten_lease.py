"""A lane lease its holder forgot (gateway/cluster/work.py ``lane_lost``,
``release_idle``): when a replica's heartbeats were late (a pause, a PostgreSQL outage:
gateway/cluster/service.py ``_beat_loop``) it forgets the lanes it held, because another
replica may have taken them. When nobody did, the lease row still names it; it used to
stay there, never given back, and a turn waiting on another replica for that lane (a
cron run, gateway/cluster/synthetic.py) waited until the forgetful replica happened to
run the session again. Seen with bench/cluster_checker.py, seeds 302 and 303: a cron run
waited 9 and 13 s, so a later due time ran first and the late run's model call counted
for the next due time (``cron-twice``). On a real PostgreSQL; nothing sleeps."""

from __future__ import annotations

from gateway.cluster import synthetic
from gateway.cluster.work import ClusterWork
from tests import cluster_harness

TTL = 3.0
KEY = "agent:main:cron:job1"

dbs = cluster_harness.replica_dbs  # fixture
pg_query = cluster_harness.pg_query


def _work(db, name: str) -> ClusterWork:
    return ClusterWork(db, name, TTL, None, side_effecting=lambda t: False,
                       debounce=lambda *a: 0)


async def test_a_lane_forgotten_after_late_beats_is_given_back_once_idle(dbs, pg_dsn):
    r1, r2 = dbs["r1"], dbs["r2"]
    w1, w2 = _work(r1, "r1"), _work(r2, "r2")
    assert (await r1.run(lambda c: synthetic.take(c, w1, KEY))).holder == "r1"
    w1.held[KEY] = 0.0  # r1 runs the lane (as synthetic.py does once it has it)
    w1.lane_lost(KEY)  # its beats were late; nobody took the lane meanwhile
    # r1 is alive: its lease stands, r2's cron run has to wait for it
    assert (await r2.run(lambda c: synthetic.take(c, w2, KEY))).holder == "r1"
    await w1.release_idle()  # the cluster tick: nothing runs or waits on r1 for it
    assert await pg_query(pg_dsn, "SELECT count(*) FROM cluster_leases WHERE name = $1",
                          "lane:" + KEY) == [(0,)]
    assert (await r2.run(lambda c: synthetic.take(c, w2, KEY))).holder == "r2"
    w1.lane_lost(KEY)  # a lease that really moved is left to its new holder
    await w1.release_idle()
    assert await pg_query(pg_dsn, "SELECT replica_id FROM cluster_leases WHERE name = $1",
                          "lane:" + KEY) == [("r2",)]
    assert KEY not in w1._forgotten
