"""Cron and heartbeat once cluster-wide (issue 15 "Cron and heartbeat"): three replicas'
cron services (the real scheduler/cron/service.py on one FakeClock, each with its own job store
and its own PostgreSQL pool and replica id) share the occurrence ledger of a real
PostgreSQL. Replicas are killed (no clean-up: their pool is terminated, their tasks
dropped mid-run, their heartbeat row goes stale) and restarted while 200 simulated
minutes pass."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from gateway.cluster import membership
from gateway.cluster.db import ClusterDB
from gateway.cluster.occurrences import CronLedger, HeartbeatSlots
from runtime.clock import FakeClock, parse_iso
from runtime.storage.postgres.migrate import migrate
from scheduler.cron.job import job_from_dict, job_to_dict, new_job
from scheduler.cron.service import CronService, RunOutcome
from scheduler.cron.store import CronStore
from tests import cluster_harness

pytestmark = pytest.mark.timeout(120)

TTL = 0.6  # seconds of real time without a heartbeat before a replica counts as dead
MINUTES = 200

pg, dsn = cluster_harness.pg, cluster_harness.dsn  # fixtures


class Replica:
    """One replica's cron: its store, its service, its ledger connection."""

    def __init__(self, name: str, dsn: str, store: CronStore, clock: FakeClock,
                 log: list) -> None:
        self.name, self.dsn, self.store, self.clock, self.log = name, dsn, store, clock, log
        self.hang_next = False
        self.db: ClusterDB | None = None
        self.svc: CronService | None = None

    async def start(self) -> None:
        self.db = ClusterDB(self.dsn)
        await self.db.run(lambda c: membership.rejoin(c, self.name, None))
        self.svc = CronService(self.store, self.clock, self.execute)
        self.svc.occurrences = CronLedger(self.db, self.name, TTL)
        await self.svc.start()

    async def execute(self, job) -> RunOutcome:
        due = job.last_due_at
        self.log.append(("start", due, self.name))
        if self.hang_next:
            self.hang_next = False
            await asyncio.Event().wait()  # killed during this run
        self.log.append(("done", due, self.name))
        return RunOutcome("ok")

    async def tick(self) -> None:
        """What the cluster loop does for cron: heartbeat, take over orphaned runs."""
        assert self.db is not None and self.svc is not None
        await self.db.run(lambda c: membership.beat(c, self.name, None))
        for job_id, due in await self.svc.occurrences.orphans(set(self.svc.running_jobs())):
            assert self.svc.retry_occurrence(job_id, due)

    async def kill(self) -> None:
        """kill -9: nothing is released or finished; the run in flight just stops."""
        assert self.db is not None and self.svc is not None
        for task in [self.svc._task, *self.svc._table.running.values()]:
            if task is not None:
                task.cancel()
        self.svc._table.running.clear()  # its stop() would log the run cancelled: skip it
        self.svc._task = None
        self.db.pool.terminate()
        self.db.pool, self.db, self.svc = None, None, None


async def test_cron_every_minute_for_200_minutes_fires_each_due_time_once(tmp_path, dsn):
    clock = FakeClock()
    boot = ClusterDB(dsn)
    await boot.run(lambda c: migrate(c))
    job = new_job(name="every minute", schedule={"kind": "cron", "expr": "* * * * *"},
                  message="tick", now=clock.time(), session_target="isolated")
    log: list = []
    replicas = []
    for name in ("a", "b", "c"):
        store = CronStore(tmp_path / name / "jobs.json")
        store.save([job])
        replicas.append(Replica(name, dsn, store, clock, log))
    for r in replicas:
        await r.start()
    first_due = None
    down: dict[str, int] = {}  # replica -> minute it comes back
    for minute in range(1, MINUTES + 1):
        kill = minute % 25 == 0  # kill the replica running this minute, back 7 min later
        for r in replicas:
            r.hang_next = kill
        await clock.advance(60)
        due = clock.time() - clock.time() % 60
        first_due = first_due or due
        await _until(lambda d=due: any(e[1] == d and e[0] == "start" for e in log))
        if kill:
            runner = next(e[2] for e in log if e[1] == due and e[0] == "start")
            await next(r for r in replicas if r.name == runner).kill()
            down[runner] = minute + 7
            for r in replicas:
                r.hang_next = False
        await _until(lambda: all(r.svc is None or not r.svc._table.running for r in replicas))
        for r in replicas:
            if r.svc is None and down.get(r.name) == minute:
                await r.start()  # restarted: its store's catch-up meets the ledger
        for r in replicas:
            if r.svc is not None:
                await r.tick()
    # let the last kill's occurrence be taken over
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and \
            len({e[1] for e in log if e[0] == "done"}) < MINUTES:
        for r in replicas:
            if r.svc is not None:
                await r.tick()
        await asyncio.sleep(0.1)
    dues = [first_due + 60 * i for i in range(MINUTES)]
    done = Counter(e[1] for e in log if e[0] == "done")
    assert [d for d in dues if done[d] != 1] == []  # no miss, no double
    assert set(done) == set(dues)
    killed = [d for d in dues if Counter(e[1] for e in log if e[0] == "start")[d] == 2]
    assert len(killed) == MINUTES // 25  # the runs a kill interrupted ran once more
    rows = await boot.run(lambda c: c.fetch(
        "SELECT due_at, state, status, attempts FROM cluster_cron_runs"))
    assert len(rows) == MINUTES and {r["state"] for r in rows} == {"done"}
    assert sorted(r["due_at"] for r in rows if r["attempts"] == 2) == killed
    for r in replicas:
        if r.svc is not None:
            await r.svc.stop()
            await r.db.close()
    await boot.close()


async def test_heartbeat_slot_is_claimed_once_per_agent(dsn):
    dbs = [ClusterDB(dsn) for _ in range(3)]
    await dbs[0].run(lambda c: migrate(c))
    slots = [HeartbeatSlots(db, f"r{i}") for i, db in enumerate(dbs)]
    now = 1_767_225_600.0
    won = await asyncio.gather(*(s.claim("main", now + i, 1800) for i, s in enumerate(slots)))
    assert sorted(won) == [False, False, True]
    assert await slots[1].claim("main", now + 1800, 1800)  # the next slot
    assert await slots[2].claim("other", now, 1800)  # another agent
    for db in dbs:
        await db.close()


async def _until(pred, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


async def test_one_due_time_seen_at_two_resolutions_is_claimed_once(dsn):
    """The replica that added an `every` job holds its anchor to the microsecond; the
    others read it back from cron_jobs in milliseconds. Both claims are one due time (seen
    live: two replicas ran a job added with `tidegate cron add --every 1m`, rows
    1796150777.6117125 and 1796150777.611 in cluster_cron_runs)."""
    dbs = [ClusterDB(dsn) for _ in range(2)]
    await dbs[0].run(lambda c: migrate(c))
    for i, db in enumerate(dbs):
        await db.run(lambda c, i=i: membership.rejoin(c, f"r{i}", None))
    creator, reader = CronLedger(dbs[0], "r0", 15.0), CronLedger(dbs[1], "r1", 15.0)
    job = new_job(name="every", schedule={"kind": "every", "interval": 60.0},
                  message="tick", now=1796150717.6117125)
    loaded = job_from_dict(job_to_dict(job))  # what the other replica reads
    due_here, due_there = job.schedule["anchor"], loaded.schedule["anchor"]
    assert due_here != due_there  # the premise: two floats for one due time
    assert await creator.claim(job.id, due_here) is None  # runs it
    assert await reader.claim(job.id, due_there) == "r0"  # sees it taken
    await creator.finished(job.id, due_here, "ok")
    rows = await cluster_harness.pg_query(dsn, "SELECT replica_id, state FROM "
                                          "cluster_cron_runs")
    assert rows == [("r0", "done")]
    for db in dbs:
        await db.close()


async def test_due_times_passed_during_a_long_run_are_claimed_and_logged_skipped(tmp_path,
                                                                                  dsn):
    """The survivor of a kill runs a due time whose turn waits for the dead replica's lane
    past the next due times (seen in the cluster checker: a due time lost, no row, no
    run-log line). Each due time that passed is claimed in the ledger and logged
    ``skipped``, except one another replica claimed: it runs there (its turn waits for the
    lane), and is not recorded here."""
    clock = FakeClock()
    db, other_db = ClusterDB(dsn), ClusterDB(dsn)
    await db.run(lambda c: migrate(c))
    job = new_job(name="every minute", schedule={"kind": "every", "interval": 60.0},
                  message="tick", now=clock.time(), session_target="isolated")
    store = CronStore(tmp_path / "a" / "jobs.json")
    store.save([job])
    lane = asyncio.Event()  # the dead replica's lane lease expiring
    runs: list[float] = []

    async def execute(j) -> RunOutcome:
        runs.append(j.last_due_at)
        await lane.wait()
        return RunOutcome("ok")
    svc = CronService(store, clock, execute)
    svc.occurrences = CronLedger(db, "a", TTL)
    await svc.start()
    first = job.schedule["anchor"]
    await clock.advance(60)
    await _until(lambda: runs == [first])
    other = CronLedger(other_db, "b", TTL)  # a live replica's timer claims first + 60
    assert await other.claim(job.id, first + 60) is None
    await clock.advance(130)  # first + 60 and first + 120 pass while the run waits
    lane.set()
    await _until(lambda: not svc._table.running)
    rows = await cluster_harness.pg_query(dsn, "SELECT due_at - $1, replica_id, state, "
                                          "status FROM cluster_cron_runs ORDER BY due_at",
                                          first)
    assert [(round(r[0]), *r[1:]) for r in rows] == [
        (0, "a", "done", "ok"), (60, "b", "running", None), (120, "a", "done", "skipped")]
    records = await svc.runs(job.id)
    assert [(r["status"], round(parse_iso(r["due_at"]) - first)) for r in records] == \
        [("ok", 0), ("skipped", 120)]
    assert "previous run still in progress" in records[1]["error"]
    assert (await svc.get(job.id)).next_run_at == first + 180
    await svc.stop()
    for d in (db, other_db):
        await d.close()


async def test_due_times_a_late_timer_jumps_over_are_claimed_and_logged_skipped(tmp_path,
                                                                                dsn):
    """A replica whose timer runs late (paused, or waiting out a PostgreSQL outage) finds
    its due time held by another replica and moves to the next slot after now: the due
    times it jumps over are claimed and logged ``skipped`` (seen in the cluster checker:
    a due time with no run and no record after the holder was stopped mid-run)."""
    clock = FakeClock()
    db, other_db = ClusterDB(dsn), ClusterDB(dsn)
    await db.run(lambda c: migrate(c))
    job = new_job(name="every minute", schedule={"kind": "every", "interval": 60.0},
                  message="tick", now=clock.time(), session_target="isolated")
    store = CronStore(tmp_path / "a" / "jobs.json")
    store.save([job])
    runs: list[float] = []

    async def execute(j) -> RunOutcome:
        runs.append(j.last_due_at)
        return RunOutcome("ok")
    first = job.schedule["anchor"]
    other = CronLedger(other_db, "b", TTL)  # a live replica runs the first due time
    assert await other.claim(job.id, first) is None
    svc = CronService(store, clock, execute)
    svc.occurrences = CronLedger(db, "a", TTL)
    await svc.start()
    await clock.advance(60 + 130)  # the timer wakes 130 s late: first + 60 and + 120 passed
    await _until(lambda: (svc._table.jobs[job.id].next_run_at or 0) > first + 120
                 and not svc._table.running)  # the claim answered, its skips written
    rows = await cluster_harness.pg_query(dsn, "SELECT due_at - $1, replica_id, state, "
                                          "status FROM cluster_cron_runs ORDER BY due_at",
                                          first)
    assert [(round(r[0]), *r[1:]) for r in rows] == [
        (0, "b", "running", None), (60, "a", "done", "skipped"),
        (120, "a", "done", "skipped")]
    assert runs == []  # nothing ran here: the held one is b's, the passed ones skipped
    records = await svc.runs(job.id)
    assert [(r["status"], round(parse_iso(r["due_at"]) - first)) for r in records] == \
        [("skipped", 60), ("skipped", 120)]
    await svc.stop()
    for d in (db, other_db):
        await d.close()
