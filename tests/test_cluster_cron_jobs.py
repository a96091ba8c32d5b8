"""Cron job definitions shared between replicas (issue 15 "Cron and heartbeat"): two
replicas' cron services (the real scheduler/cron/service.py, each with its own SyncBridge, pool,
LISTEN connection and replica id) on PostgreSQL's ``cron_jobs``. A job added through one
replica (what the control API does) is seen and fired by the cluster once per due time;
a job an offline CLI adds is picked up too; a job removed on one replica stops on all."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from gateway.cluster import membership
from gateway.cluster.cron_jobs import shared_jobs
from gateway.cluster.db import ClusterDB
from gateway.cluster.occurrences import CronLedger
from runtime.clock import FakeClock
from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.cron import PgCronRecords
from runtime.storage.postgres.migrate import migrate
from scheduler.cron.job import new_job
from scheduler.cron.service import CronService, RunOutcome
from scheduler.cron.store import CronStore
from tests.cluster_harness import until

pytestmark = pytest.mark.timeout(120)


class Replica:
    def __init__(self, name: str, dsn: str, clock: FakeClock, log: list) -> None:
        self.name, self.dsn, self.clock, self.log = name, dsn, clock, log

    async def start(self) -> None:
        self.bridge = await asyncio.to_thread(SyncBridge, self.dsn)
        self.store = CronStore(records=PgCronRecords(self.bridge))
        self.svc = CronService(self.store, self.clock, self.execute)
        self.db = ClusterDB(self.dsn)
        self.jobs = shared_jobs(self.svc, self.store.records, self.db)
        await self.db.run(lambda c: membership.rejoin(c, self.name, None))
        self.svc.occurrences = CronLedger(self.db, self.name, 15.0)
        await self.svc.start()

    async def execute(self, job) -> RunOutcome:
        self.log.append((job.id, job.last_due_at, self.name))
        return RunOutcome("ok")

    async def stop(self) -> None:
        await self.svc.stop()
        await self.jobs.close()
        await self.db.close()
        await asyncio.to_thread(self.bridge.close)


async def _minutes(clock, replicas, n):
    for _ in range(n):
        await clock.advance(60)
        await asyncio.sleep(0.05)
        await until(lambda: all(not r.svc._table.running for r in replicas), "runs to end")


async def test_jobs_added_and_removed_on_one_replica_reach_the_other(pg_dsn):
    boot = ClusterDB(pg_dsn)
    await boot.run(lambda c: migrate(c))
    clock, log = FakeClock(), []
    a, b = Replica("a", pg_dsn, clock, log), Replica("b", pg_dsn, clock, log)
    await a.start()
    await b.start()
    job = await a.svc.add(new_job(name="every minute", schedule={"kind": "every",
                                  "interval": 60}, message="tick", now=clock.time()))
    await until(lambda: [j.id for j in b.svc._table.jobs.values()] == [job.id], "b sees it")
    await _minutes(clock, [a, b], 5)
    dues = Counter(due for jid, due, _ in log if jid == job.id)
    assert len(dues) == 5 and set(dues.values()) == {1}  # each due time once, cluster-wide
    # An offline CLI edit (its own store, no gateway API): picked up by both.
    cli = CronStore(records=PgCronRecords(a.bridge))
    with cli.transaction() as jobs:
        jobs.append(new_job(name="from cli", schedule={"kind": "every", "interval": 60},
                            message="cli", now=clock.time()))
    cli_id = jobs[-1].id
    await until(lambda: cli_id in a.svc._table.jobs and cli_id in b.svc._table.jobs, "cli job")
    await b.svc.remove(job.id)  # removed on the other replica
    await until(lambda: job.id not in a.svc._table.jobs, "a drops the removed job")
    before = len([e for e in log if e[0] == job.id])
    await _minutes(clock, [a, b], 3)
    assert len([e for e in log if e[0] == job.id]) == before  # stopped everywhere
    cli_runs = Counter(due for jid, due, _ in log if jid == cli_id)
    assert len(cli_runs) >= 3 and set(cli_runs.values()) == {1}
    assert [j.id for j in (await asyncio.to_thread(cli.load))] == [cli_id]
    await a.stop()
    await b.stop()
    await boot.close()


async def test_a_stale_replica_cannot_write_a_removed_job_back(pg_dsn):
    boot = ClusterDB(pg_dsn)
    await boot.run(lambda c: migrate(c))
    clock = FakeClock()
    bridge = await asyncio.to_thread(SyncBridge, pg_dsn)
    one, two = (CronStore(records=PgCronRecords(bridge)) for _ in range(2))
    job = new_job(name="x", schedule={"kind": "every", "interval": 60}, message="x",
                  now=clock.time())
    one.save([job])
    stale = two.load()  # replica two read it
    one.save([])  # replica one removed it
    stale[0].next_run_at = clock.time() + 999  # two still runs it and saves its state
    two.save(stale)
    assert one.load() == []
    await asyncio.to_thread(bridge.close)
    await boot.close()
