"""Cron jobs and their run log on both storage backends (issue 15 "the same behavioural
tests run against both backends"): the real scheduler/cron/service.py on a FakeClock over
``cron/jobs.json`` or PostgreSQL's ``cron_jobs`` / ``cron_runs``."""

from __future__ import annotations

import asyncio

import pytest

from runtime.clock import FakeClock
from scheduler.cron.job import new_job
from scheduler.cron.service import CronService, RunOutcome
from scheduler.cron.store import CronStore, CronStoreError


async def _store(backend) -> CronStore:
    records = await backend.records("cron")
    if records is None:
        return CronStore(backend.tmp / "cron" / "jobs.json")
    return CronStore(records=records)


def _every_minute(clock, name="tick"):
    return new_job(name=name, schedule={"kind": "every", "interval": 60}, message=name,
                   now=clock.time())


async def test_a_job_fires_logs_its_run_and_survives_a_restart(backend):
    clock, ran = FakeClock(), []

    async def execute(job):
        ran.append((job.id, job.last_due_at))
        return RunOutcome("ok", delivered=True)

    svc = CronService(await _store(backend), clock, execute)
    await svc.start()
    job = await svc.add(_every_minute(clock))
    await clock.advance(61)
    # The PostgreSQL store answers from its own connection: under load the claim of the
    # occurrence takes real time, so wait on the loop (the clock stays where it is).
    deadline = asyncio.get_running_loop().time() + 20
    while not (ran and svc.status()["running"] == 0) and \
            asyncio.get_running_loop().time() < deadline:
        await clock.advance(0)
        await asyncio.sleep(0.01)
    await svc.stop()
    assert [r[0] for r in ran] == [job.id]
    again = await _store(backend)
    (stored,) = again.load()
    assert (stored.id, stored.last_status) == (job.id, "ok")
    assert stored.next_run_at > ran[0][1]
    (run,) = again.read_runs(job.id, 10)
    assert (run["status"], run["delivered"], run["job_id"]) == ("ok", True, job.id)


async def test_order_updates_and_removals_stick(backend):
    clock = FakeClock()
    store = await _store(backend)
    svc = CronService(store, clock, lambda job: RunOutcome("ok"))
    await svc.start()
    jobs = [await svc.add(_every_minute(clock, f"j{i}")) for i in range(5)]
    await svc.update(jobs[2].id, name="renamed")
    await svc.remove(jobs[0].id)
    await svc.stop()
    reloaded = (await _store(backend)).load()
    assert [j.name for j in reloaded] == ["j1", "renamed", "j3", "j4"]


async def test_run_log_keeps_the_newest_records_in_order(backend):
    store = await _store(backend)
    for i in range(30):
        store.append_run("job1", {"n": i, "status": "ok"})
    assert [r["n"] for r in store.read_runs("job1", 5)] == [25, 26, 27, 28, 29]
    assert store.read_runs("other", 5) == []


async def test_an_unreadable_store_refuses_to_load_and_is_not_overwritten(backend):
    clock = FakeClock()
    store = await _store(backend)
    store.save([_every_minute(clock)])
    if backend.name == "embedded":
        store.path.write_text("{broken")
    else:
        await backend.raw("UPDATE cron_jobs SET job = '{broken'")
    svc = CronService(await _store(backend), clock, lambda job: RunOutcome("ok"))
    with pytest.raises(CronStoreError):
        await svc.start()
    if backend.name == "embedded":
        assert store.path.read_text() == "{broken"
    else:
        assert await backend.raw("SELECT job FROM cron_jobs") == [("{broken",)]
