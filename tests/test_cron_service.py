"""scheduler/cron/service.py + cron_store.py: the cron service on a FakeClock (never sleeps)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from runtime.clock import FakeClock, parse_iso, utc_iso
from scheduler.cron.job import (
    delivery_route,
    job_from_dict,
    job_to_dict,
    new_job,
    parse_at,
    parse_duration,
)
from scheduler.cron.service import CronJobBusy, CronJobNotFound, CronService, RunOutcome
from scheduler.cron.store import CronStore, CronStoreError

T0 = parse_iso("2026-01-01T00:00:00Z")  # FakeClock's default start


class Executor:
    """The injected ``execute``: records (job_id, time) and follows a script."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[tuple[str, float]] = []
        self.fail = False
        self.block: asyncio.Event | None = None
        self.sleep: float = 0.0

    async def __call__(self, job) -> RunOutcome:
        self.calls.append((job.id, self.clock.time()))
        if self.block is not None:
            await self.block.wait()
        if self.sleep:
            await self.clock.sleep(self.sleep)
        if self.fail:
            raise RuntimeError("model unavailable")
        return RunOutcome("ok", delivered=True)

    def times(self) -> list[float]:
        return [t - T0 for _, t in self.calls]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def store(tmp_path: Path) -> CronStore:
    return CronStore(tmp_path / "cron" / "jobs.json")


def disk(store: CronStore) -> dict:
    return json.loads(store.path.read_text())


def run_log(store: CronStore, job_id: str) -> list[dict]:
    path = store.runs_dir / f"{job_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def make(store, clock, ex, **kw) -> CronService:
    svc = CronService(store, clock, ex, max_sleep=kw.pop("max_sleep", 3600), **kw)
    await svc.start()
    return svc


def every(seconds: float, now: float = T0, **kw):
    return new_job(name=kw.pop("name", "ping"), schedule={"kind": "every", "interval": seconds},
                   message="check the service", now=now, **kw)


async def test_every_job_fires_at_each_interval(store, clock):
    ex = Executor(clock)
    svc = await make(store, clock, ex)
    job = await svc.add(every(300))
    assert job.next_run_at == T0 + 300
    await clock.advance(299)
    assert ex.calls == []
    await clock.advance(1201)
    assert ex.times() == [300, 600, 900, 1200, 1500]
    lines = run_log(store, job.id)
    assert [r["status"] for r in lines] == ["ok"] * 5
    assert lines[0]["started_at"] == utc_iso(T0 + 300) and lines[0]["delivered"] is True
    assert lines[0]["due_at"] == utc_iso(T0 + 300) and lines[0]["duration_ms"] == 0
    saved = disk(store)["jobs"][0]
    assert saved["next_run_at"] == utc_iso(T0 + 1800)
    assert saved["last_run_at"] == utc_iso(T0 + 1500) and saved["last_status"] == "ok"
    await svc.stop()


async def test_cron_job_fires_at_the_right_instants(store, clock):
    ex = Executor(clock)
    svc = await make(store, clock, ex)
    job = new_job(name="prs", schedule={"kind": "cron", "expr": "0 9 * * 1-5",
                                        "tz": "Europe/Berlin"},
                  message="check the PR review queue", now=T0)
    await svc.add(job)
    await clock.advance(6 * 86400)  # Thu 1 Jan .. Tue 6 Jan 2026; 09:00 CET = 08:00Z
    assert [utc_iso(t) for _, t in ex.calls] == [
        "2026-01-01T08:00:00.000Z", "2026-01-02T08:00:00.000Z",
        "2026-01-05T08:00:00.000Z", "2026-01-06T08:00:00.000Z"]
    await svc.stop()


async def test_cron_job_uses_tz_default(store, clock):
    ex = Executor(clock)
    svc = await make(store, clock, ex, tz_default="America/New_York")
    await svc.add(new_job(name="x", schedule={"kind": "cron", "expr": "0 9 * * *"},
                          message="m", now=T0))
    await clock.advance(86400)
    assert [utc_iso(t) for _, t in ex.calls] == ["2026-01-01T14:00:00.000Z"]
    await svc.stop()


async def test_at_job_runs_once_and_is_deleted(store, clock):
    ex = Executor(clock)
    svc = await make(store, clock, ex)
    job = new_job(name="remind", schedule={"kind": "at", "at": parse_at("20m", T0)},
                  message="stand up", now=T0)
    assert job.delete_after_run is True
    job = await svc.add(job)
    assert disk(store)["jobs"][0]["schedule"]["at"] == "2026-01-01T00:20:00.000Z"
    await clock.advance(3600)
    assert ex.times() == [1200]
    assert await svc.list() == [] and disk(store)["jobs"] == []
    assert [r["status"] for r in run_log(store, job.id)] == ["ok"]
    await svc.stop()


async def test_failed_at_job_is_disabled_not_deleted(store, clock):
    ex = Executor(clock)
    ex.fail = True
    svc = await make(store, clock, ex)
    job = await svc.add(new_job(name="once", schedule={"kind": "at", "at": T0 + 60},
                                message="m", now=T0))
    await clock.advance(7200)
    assert ex.times() == [60]
    kept = await svc.get(job.id)
    assert kept.enabled is False and kept.next_run_at is None
    assert kept.last_status == "error" and "model unavailable" in kept.last_error
    await svc.stop()


async def test_backoff_schedule_and_recovery(store, clock):
    ex = Executor(clock)
    ex.fail = True
    svc = await make(store, clock, ex)
    job = await svc.add(every(10))
    await clock.advance(8500)
    # failures at 10, then +30 s, +1 min, +5 min, +15 min, +60 min, +60 min
    assert ex.times() == [10, 40, 100, 400, 1300, 4900, 8500]
    state = await svc.get(job.id)
    assert state.consecutive_errors == 7 and state.next_run_at == T0 + 8500 + 3600
    ex.fail = False
    await clock.advance(3600)
    assert ex.times()[-1] == 12100
    state = await svc.get(job.id)
    assert state.consecutive_errors == 0 and state.last_status == "ok"
    await clock.advance(30)
    assert ex.times()[-3:] == [12110, 12120, 12130]  # back on the 10 s schedule
    await svc.stop()


async def test_backoff_never_runs_before_the_regular_schedule(store, clock):
    ex = Executor(clock)
    ex.fail = True
    svc = await make(store, clock, ex)
    await svc.add(every(3600))
    await clock.advance(3 * 3600)
    assert ex.times() == [3600, 7200, 10800]  # backoff (30 s, 1 min) < interval
    await svc.stop()


async def test_alert_after_exactly_two_consecutive_failures(store, clock):
    ex = Executor(clock)
    alerts: list[tuple[str, str]] = []

    async def on_alert(job, text):
        alerts.append((job.id, text))

    ex.fail = True
    svc = await make(store, clock, ex, on_alert=on_alert)
    job = await svc.add(every(3600, name="health"))
    await clock.advance(3600)
    assert alerts == []
    await clock.advance(3600)
    assert len(alerts) == 1
    assert alerts[0][0] == job.id
    assert "'health'" in alerts[0][1] and "2 times in a row" in alerts[0][1]
    assert "RuntimeError: model unavailable" in alerts[0][1]
    await clock.advance(3 * 3600)  # failures 3..5: no further alerts
    assert len(alerts) == 1
    ex.fail = False
    await clock.advance(3600)  # recovery
    ex.fail = True
    await clock.advance(3600)
    assert len(alerts) == 1
    await clock.advance(3600)
    assert len(alerts) == 2  # a new streak alerts again
    await svc.stop()


async def test_timeout_status(store, clock):
    ex = Executor(clock)
    ex.sleep = 1000
    svc = await make(store, clock, ex)
    job = every(600)
    job.timeout = 60
    job = await svc.add(job)
    await clock.advance(700)
    lines = run_log(store, job.id)
    assert len(lines) == 1
    assert lines[0]["status"] == "timeout" and lines[0]["duration_ms"] == 60_000
    assert "timeout of 60s" in lines[0]["error"]
    state = await svc.get(job.id)
    assert state.last_status == "timeout" and state.consecutive_errors == 1
    assert state.next_run_at == T0 + 1200  # regular slot is later than the 30 s backoff
    await svc.stop()


async def test_catch_up_once_after_downtime(store, clock):
    ex = Executor(clock)
    svc = await make(store, clock, ex)
    job = await svc.add(new_job(name="hourly", schedule={"kind": "cron", "expr": "0 * * * *"},
                                message="m", now=T0))
    job2 = await svc.add(every(3600, name="every-hour"))
    await clock.advance(3600)
    assert ex.times() == [3600, 3600]
    await svc.stop()
    await clock.advance(5.5 * 3600)  # down from 01:00 to 06:30: 02:00 .. 06:00 missed
    assert len(ex.calls) == 2
    ex2 = Executor(clock)
    svc2 = await make(store, clock, ex2)
    await clock.advance(1)
    assert ex2.times() == [6.5 * 3600, 6.5 * 3600]  # one catch-up run each, not five
    for jid in (job.id, job2.id):
        assert run_log(store, jid)[-1]["due_at"] == "2026-01-01T06:00:00.000Z"
        assert len(run_log(store, jid)) == 2
    await clock.advance(1800)
    assert ex2.times()[2:] == [7 * 3600, 7 * 3600]  # then back on schedule
    await svc2.stop()


async def test_downtime_longer_than_catch_up_is_skipped_and_logged(store, clock):
    ex = Executor(clock)
    svc = await make(store, clock, ex)
    await clock.advance(8 * 3600)  # 08:00
    job = await svc.add(new_job(name="daily", schedule={"kind": "cron", "expr": "0 9 * * *"},
                                message="m", now=clock.time()))
    await svc.stop()
    await clock.advance(5 * 3600)  # down 08:00 .. 13:00; the 09:00 run is 4 h old
    ex2 = Executor(clock)
    with capture_logs() as logs:
        svc2 = await make(store, clock, ex2, catch_up=3600)
        await clock.advance(1)
    assert ex2.calls == []
    lines = run_log(store, job.id)
    assert [r["status"] for r in lines] == ["skipped"]
    assert "catch_up=3600s" in lines[0]["error"]
    assert lines[0]["due_at"] == "2026-01-01T09:00:00.000Z"
    skipped = [e for e in logs if e["event"] == "cron_run_skipped"]
    assert skipped and skipped[0]["job_id"] == job.id
    state = await svc2.get(job.id)
    assert state.next_run_at == parse_iso("2026-01-02T09:00:00Z") and state.last_status == "skipped"
    await clock.advance(86400)
    assert len(ex2.calls) == 1
    await svc2.stop()


async def test_each_due_time_runs_at_most_once_across_a_crash(store, clock):
    ex = Executor(clock)
    ex.block = asyncio.Event()
    svc = await make(store, clock, ex)
    job = await svc.add(every(600))
    await clock.advance(600)
    assert ex.times() == [600]
    # the daemon "crashes" mid-run: what is on disk right now is all that survives
    crashed = store.path.read_bytes()
    saved = json.loads(crashed)["jobs"][0]
    assert saved["last_due_at"] == utc_iso(T0 + 600) == saved["next_run_at"]
    log_size = (store.runs_dir / f"{job.id}.jsonl").stat().st_size if (
        store.runs_dir / f"{job.id}.jsonl").exists() else 0
    await svc.stop()
    store.path.write_bytes(crashed)
    path = store.runs_dir / f"{job.id}.jsonl"
    with path.open("r+b") as f:
        f.truncate(log_size)
    await clock.advance(5)
    ex2 = Executor(clock)
    svc2 = await make(store, clock, ex2)
    await clock.advance(1)
    assert ex2.calls == []  # the 600 s slot is not run again
    lines = run_log(store, job.id)
    assert lines[-1]["status"] == "error" and "interrupted" in lines[-1]["error"]
    assert lines[-1]["due_at"] == utc_iso(T0 + 600)
    assert (await svc2.get(job.id)).next_run_at == T0 + 1200
    await clock.advance(600)
    assert ex2.times() == [1200]
    await svc2.stop()


async def test_stop_cancels_runs_in_flight_and_counts_the_slot(store, clock):
    ex = Executor(clock)
    ex.block = asyncio.Event()
    svc = await make(store, clock, ex)
    job = await svc.add(every(600))
    await clock.advance(600)
    await svc.stop()
    lines = run_log(store, job.id)
    assert lines[-1]["status"] == "error" and "cancelled" in lines[-1]["error"]
    saved = disk(store)["jobs"][0]
    assert saved["next_run_at"] == utc_iso(T0 + 1200) and saved["consecutive_errors"] == 0


async def test_run_now_even_if_disabled_keeps_schedule(store, clock):
    ex = Executor(clock)
    svc = await make(store, clock, ex)
    job = await svc.add(every(3600))
    await svc.disable(job.id)
    assert (await svc.get(job.id)).next_run_at is None
    await svc.enable(job.id)
    before = await svc.get(job.id)
    await clock.advance(100)
    out = await svc.run_now(job.id)
    assert out.status == "ok" and ex.times() == [100]
    after = await svc.get(job.id)
    assert after.next_run_at == before.next_run_at and after.last_run_at == T0 + 100
    assert run_log(store, job.id)[-1]["manual"] is True
    await svc.disable(job.id)
    assert (await svc.run_now(job.id)).status == "ok"
    assert len(ex.calls) == 2
    await clock.advance(7200)
    assert len(ex.calls) == 2  # disabled: no scheduled runs
    await svc.stop()


async def test_slot_due_while_running_is_skipped(store, clock):
    ex = Executor(clock)
    ex.sleep = 150  # each run takes 150 s
    svc = await make(store, clock, ex)
    job = await svc.add(every(100))
    await clock.advance(400)
    statuses = [r["status"] for r in run_log(store, job.id)]
    assert statuses[0] == "ok"
    assert ex.times() == [100, 300]  # the 200 s slot came while the first run was busy
    await svc.stop()


async def test_slots_passed_during_a_long_scheduled_run_are_logged_skipped(store, clock):
    """A scheduled run is off the due queue while it runs, and its end moves the job to the
    first slot after it: the slots that passed meanwhile were never dispatched, and went
    unrecorded (the cluster checker saw a due time lost after a replica's kill, the
    survivor's run waiting for the dead replica's lane). They are logged ``skipped``."""
    ex = Executor(clock)
    ex.sleep = 250  # the run due at 100 s ends at 350 s: past the 200 s and 300 s slots
    svc = await make(store, clock, ex)
    job = await svc.add(every(100))
    await clock.advance(360)
    log_ = run_log(store, job.id)
    assert [(r["status"], parse_iso(r["due_at"]) - T0) for r in log_] == \
        [("ok", 100), ("skipped", 200), ("skipped", 300)]
    assert "previous run still in progress" in log_[1]["error"]
    assert (await svc.get(job.id)).next_run_at == T0 + 400
    ex.sleep = 0
    await clock.advance(50)
    assert ex.times() == [100, 400]  # the next slot runs, nothing twice
    assert len(run_log(store, job.id)) == 4
    await svc.stop()


async def test_edit_during_a_run_keeps_the_new_schedule(store, clock):
    """An edit to a one-shot while the old schedule's run is in flight: the finishing run
    must neither disable the job (as a fired ``at`` job) nor reschedule by the old rule."""
    ex = Executor(clock)
    ex.sleep = 8  # the run takes 8 s
    svc = await make(store, clock, ex)
    job = await svc.add(every(6))
    await clock.advance(7)  # the 6 s run is in flight
    assert ex.times() == [6]
    edited = await svc.update(job.id, schedule={"kind": "at", "at": T0 + 7200})
    await clock.advance(10)  # the old run finishes
    current = await svc.get(job.id)
    assert current.enabled and current.next_run_at == T0 + 7200
    assert edited.next_run_at == T0 + 7200
    await clock.advance(7200)
    assert ex.times() == [6, 7200]  # the new one-shot fires once, the old interval never
    await svc.stop()


async def test_run_now_busy(store, clock):
    ex = Executor(clock)
    ex.block = asyncio.Event()
    svc = await make(store, clock, ex)
    job = await svc.add(every(3600))
    task = asyncio.create_task(svc.run_now(job.id))
    await clock.settle()
    with pytest.raises(CronJobBusy):
        await svc.run_now(job.id)
    ex.block.set()
    assert (await task).status == "ok"
    await svc.stop()


async def test_api_errors_and_update(store, clock):
    ex = Executor(clock)
    svc = await make(store, clock, ex)
    job = await svc.add(every(3600))
    with pytest.raises(CronJobNotFound):
        await svc.get("nope")
    with pytest.raises(ValueError, match="cannot update field"):
        await svc.update(job.id, next_run_at=5)
    with pytest.raises(ValueError, match="schedule: minute: 61 out of range 0-59"):
        await svc.update(job.id, schedule={"kind": "cron", "expr": "61 * * * *"})
    with pytest.raises(ValueError, match="already exists"):
        await svc.add(job)
    updated = await svc.update(job.id, schedule={"kind": "cron", "expr": "*/5 * * * *"},
                               name="renamed")
    assert updated.next_run_at == T0 + 300 and updated.name == "renamed"
    assert disk(store)["jobs"][0]["schedule"] == {"kind": "cron", "expr": "*/5 * * * *"}
    await svc.remove(job.id)
    assert await svc.list() == []
    with pytest.raises(CronJobNotFound):
        await svc.remove(job.id)
    await svc.stop()


async def test_jobs_json_is_valid_after_each_operation(store, clock):
    ex = Executor(clock)
    svc = await make(store, clock, ex)
    a = await svc.add(every(60, name="a"))
    b = await svc.add(new_job(name="b", schedule={"kind": "at", "at": T0 + 90}, message="m",
                              now=T0, session_target="isolated"))
    ops = [
        lambda: svc.update(a.id, name="a2"), lambda: svc.disable(a.id),
        lambda: svc.enable(a.id), lambda: clock.advance(100), lambda: svc.run_now(a.id),
        lambda: svc.remove(a.id),
    ]
    for op in ops:
        await op()
        data = disk(store)
        assert data["version"] == 1
        for item in data["jobs"]:
            job_from_dict(item)  # every saved job parses back
    assert [p.name for p in store.path.parent.iterdir() if p.name.startswith(".jobs.")] == []
    assert data["jobs"] == []  # a removed, b ran (at) and was deleted
    assert run_log(store, b.id)[0]["status"] == "ok"
    await svc.stop()


async def test_reload_after_external_edit(store, clock):
    ex = Executor(clock)
    svc = await make(store, clock, ex)
    with store.transaction() as jobs:  # what the CLI does while the daemon is down/elsewhere
        jobs.append(every(120, name="from-cli"))
    await svc.reload()
    listed = await svc.list()
    assert [j.name for j in listed] == ["from-cli"] and listed[0].next_run_at == T0 + 120
    await clock.advance(120)
    assert ex.times() == [120]
    await svc.stop()


async def test_corrupt_store_is_reported_and_never_overwritten(store, clock):
    store.path.parent.mkdir(parents=True)
    store.path.write_text('{"version": 1, "jobs": [')
    svc = CronService(store, clock, Executor(clock))
    with pytest.raises(CronStoreError, match=r"jobs\.json: not valid JSON"):
        await svc.start()
    with pytest.raises(CronStoreError, match="refusing to overwrite"):
        store.save([every(60)])
    assert store.path.read_text() == '{"version": 1, "jobs": ['


def test_invalid_job_in_store_names_file_and_job(store):
    store.path.parent.mkdir(parents=True)
    store.path.write_text(json.dumps({"jobs": [
        {"id": "abc", "schedule": {"kind": "cron", "expr": "* * *"}, "payload": {"message": "x"}}
    ]}))
    with pytest.raises(CronStoreError, match=r"jobs\.json: jobs\[0\] \(id 'abc'\): schedule: "
                                             r"expected 5 fields"):
        store.load()


def test_tolerant_load_fills_defaults_and_keeps_unknown_keys(store):
    store.path.parent.mkdir(parents=True)
    store.path.write_text(json.dumps({"jobs": [
        {"id": "j1", "schedule": {"kind": "every", "interval": 60},
         "payload": {"message": "hi"}, "futureField": {"x": 1}},
        {"id": "j2", "schedule": {"kind": "at", "at": "2026-02-01T10:00:00+01:00"},
         "payload": {"message": "hi"}, "session_target": "isolated"},
    ]}))
    j1, j2 = store.load()
    assert (j1.enabled, j1.agent, j1.delivery, j1.timeout, j1.session_target) == (
        True, "main", "none", 600.0, "main")
    assert j1.consecutive_errors == 0 and j1.next_run_at is None
    assert j2.timeout == 3600.0 and j2.delete_after_run is True
    assert j2.schedule["at"] == parse_iso("2026-02-01T09:00:00Z")
    store.save([j1, j2])
    raw = disk(store)["jobs"]
    assert raw[0]["futureField"] == {"x": 1}
    assert raw[1]["schedule"]["at"] == "2026-02-01T09:00:00.000Z"


def test_new_job_defaults_and_validation():
    iso = new_job(name="n", schedule={"kind": "every", "interval": 60}, message="m", now=T0,
                  session_target="isolated")
    # no chat created it: it delivers nowhere (never "whichever chat spoke last")
    assert (iso.timeout, iso.delivery, iso.delete_after_run) == (3600.0, "none", False)
    assert len(iso.id) == 12 and iso.schedule["anchor"] == T0 + 60
    origin = {"channel": "telegram", "account": "work", "to": "42", "thread": None}
    mine = new_job(name="n", schedule={"kind": "every", "interval": 60}, message="m", now=T0,
                   session_target="isolated", origin=origin)
    assert (mine.delivery, mine.origin, delivery_route(mine)) == ("origin", origin, origin)
    assert job_from_dict(job_to_dict(mine)).origin == origin  # kept in jobs.json
    main = new_job(name="n", schedule={"kind": "cron", "expr": "@daily"}, message="m", now=T0,
                   delivery="telegram:12345:99")
    assert (main.timeout, main.delivery) == (600.0, "telegram:12345:99")
    for bad, msg in [
        ({"schedule": {"kind": "weekly"}}, "schedule.kind"),
        ({"schedule": {"kind": "every", "interval": 0}}, "schedule.interval"),
        ({"session_target": "side"}, "session_target"),
        ({"delivery": "somewhere"}, "delivery"),
        ({"delivery": "origin"}, "delivery: origin needs the route"),
        ({"origin": {"channel": "telegram"}}, "origin"),
        ({"timeout": -1}, "timeout"),
        ({"message": " "}, "payload.message"),
    ]:
        kw = {"name": "n", "schedule": {"kind": "every", "interval": 60}, "message": "m",
              "now": T0, **bad}
        with pytest.raises(ValueError, match=msg):
            new_job(**kw)


def test_parse_at_and_duration():
    assert parse_at("20m", T0) == T0 + 1200
    assert parse_at("+2h", T0) == T0 + 7200
    assert parse_at("1d", T0) == T0 + 86400
    assert parse_at("30s", T0) == T0 + 30
    assert parse_at("2026-03-01T09:00:00+01:00", T0) == parse_iso("2026-03-01T08:00:00Z")
    assert parse_at("2026-03-01T09:00:00Z", T0) == parse_iso("2026-03-01T09:00:00Z")
    with pytest.raises(ValueError, match="invalid time 'tomorrow'"):
        parse_at("tomorrow", T0)
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90") == 90 and parse_duration(45) == 45
    assert parse_duration("500ms") == 0.5 and parse_duration("1w") == 604800
    for bad in ("", "5x", "h", "10m5", "-5m"):
        with pytest.raises(ValueError, match="invalid duration"):
            parse_duration(bad)


def test_run_log_append_only_and_tail(store):
    for i in range(120):
        store.append_run("job1", {"n": i, "status": "ok"})
    path = store.runs_dir / "job1.jsonl"
    with path.open("ab") as f:
        f.write(b'{"n": "torn')  # a crash mid-line
    store.append_run("job1", {"n": 120, "status": "ok"})
    runs = store.read_runs("job1", limit=5)
    assert [r["n"] for r in runs] == [116, 117, 118, 119, 120]
    assert len(path.read_text().splitlines()) == 122  # nothing rewritten, torn line kept
    assert store.read_runs("missing") == []
    with pytest.raises(ValueError):
        store.run_log_path("../etc/passwd")


async def test_runs_api_and_status(store, clock):
    ex = Executor(clock)
    svc = await make(store, clock, ex)
    job = await svc.add(every(60))
    await clock.advance(300)
    runs = await svc.runs(job.id, limit=2)
    assert [r["started_at"] for r in runs] == [utc_iso(T0 + 240), utc_iso(T0 + 300)]
    st = svc.status()
    assert st["jobs"] == 1 and st["next_run_at"] == utc_iso(T0 + 360)
    await svc.stop()


async def test_many_jobs_share_one_timer(store, clock):
    ex = Executor(clock)
    store.save([every(60 + i % 7, name=f"j{i}") for i in range(120)])
    svc = await make(store, clock, ex)
    await clock.advance(600)
    per_job: dict[str, int] = {}
    for jid, _ in ex.calls:
        per_job[jid] = per_job.get(jid, 0) + 1
    assert len(per_job) == 120
    jobs = {j.id: j for j in await svc.list()}
    for jid, n in per_job.items():
        iv = jobs[jid].schedule["interval"]
        assert n == int(600 // iv)
    await svc.stop()


def test_save_rejects_duplicates_and_invalid_jobs(store):
    a = every(60)
    store.save([a])
    before = store.path.read_bytes()
    with pytest.raises(CronStoreError, match="duplicate job id"):
        store.save([a, a.copy()])
    bad = every(60)
    bad.delivery = "nowhere"
    with pytest.raises(CronStoreError, match="delivery"):
        store.save([a, bad])
    assert store.path.read_bytes() == before


async def test_failed_save_rolls_back_the_api_change(store, clock):
    svc = await make(store, clock, Executor(clock))
    job = await svc.add(every(60, name="keep"))
    store.path.write_text("{broken")  # someone breaks the file while the daemon runs
    with pytest.raises(CronStoreError):
        await svc.add(every(60, name="new"))
    with pytest.raises(CronStoreError):
        await svc.update(job.id, name="renamed")
    with pytest.raises(CronStoreError):
        await svc.remove(job.id)
    assert [j.name for j in await svc.list()] == ["keep"]
    assert store.path.read_text() == "{broken"
    await svc.stop()


async def test_real_clock_smoke(store):
    from runtime.clock import SystemClock

    clock = SystemClock()
    done = asyncio.Event()

    async def execute(job):
        done.set()
        return RunOutcome("ok")

    svc = CronService(store, clock, execute)
    await svc.start()
    job = await svc.add(new_job(name="soon", schedule={"kind": "at", "at": clock.time() + 0.2},
                                message="m", now=clock.time()))
    await asyncio.wait_for(done.wait(), 2.0)
    await asyncio.sleep(0.05)
    assert await svc.list() == []
    assert [r["status"] for r in run_log(store, job.id)] == ["ok"]
    await svc.stop()


async def test_schedule_edited_while_stopped_fires_on_the_new_schedule_only(store, clock):
    """jobs.json edited while the gateway was stopped (06:00 -> 07:00): the stored
    next_run_at (06:00) used to fire, then 07:00 as well."""
    ex = Executor(clock)
    svc = await make(store, clock, ex)
    job = await svc.add(new_job(name="daily", schedule={"kind": "cron", "expr": "0 6 * * *",
                                                        "tz": "UTC"}, message="m", now=T0))
    other = await svc.add(every(3600, name="untouched"))
    assert job.next_run_at == T0 + 6 * 3600
    await svc.stop()
    data = disk(store)
    data["jobs"][0]["schedule"]["expr"] = "0 7 * * *"  # the operator's edit
    store.path.write_text(json.dumps(data))
    ex2 = Executor(clock)
    with capture_logs() as logs:
        svc2 = await make(store, clock, ex2)
    [changed] = [e for e in logs if e["event"] == "cron_schedule_changed"]
    assert (changed["job_id"], changed["next_run_at"]) == (job.id, "2026-01-01T07:00:00.000Z")
    await clock.advance(8 * 3600)
    assert [t for jid, t in ex2.calls if jid == job.id] == [T0 + 7 * 3600]
    assert [t - T0 for jid, t in ex2.calls if jid == other.id][:2] == [3600, 7200]
    assert disk(store)["jobs"][0]["next_run_at"] == "2026-01-02T07:00:00.000Z"
    await svc2.stop()


async def test_a_job_that_fires_decades_apart_keeps_its_next_run(store, clock):
    ex = Executor(clock)
    svc = await make(store, clock, ex, max_sleep=40 * 365 * 86400)
    job = await svc.add(new_job(name="leap-sunday", message="m", now=T0, schedule={
        "kind": "cron", "expr": "0 0 29 2 */7", "tz": "UTC"}))
    assert job.next_run_at == parse_iso("2032-02-29T00:00:00Z")
    await clock.advance(parse_iso("2032-03-01T00:00:00Z") - T0)
    assert [utc_iso(t) for _, t in ex.calls] == ["2032-02-29T00:00:00.000Z"]
    assert disk(store)["jobs"][0]["next_run_at"] == "2060-02-29T00:00:00.000Z"
    assert disk(store)["jobs"][0]["last_status"] == "ok"
    await svc.stop()


class CancelSwallowingStore(CronStore):
    """A jobs store whose awaited save, once ``hold`` is set, waits and then completes
    even when cancelled: what asyncio.wait_for does on Python 3.11 when the PostgreSQL
    write finishes as the cancel arrives (runtime/storage/postgres/bridge.py ``acall``)."""

    hold = False

    async def asave(self, jobs, changed=None) -> None:
        if self.hold:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass  # the cancel is lost, the write "completed"
        await super().asave(jobs, changed)


async def test_stop_ends_the_timer_even_when_its_cancel_is_lost(tmp_path, clock):
    """A SIGTERMed replica never exited: the timer's cancel was lost in a jobs write and
    the timer ran on (cron runs kept starting during the shutdown), ``stop`` waiting for
    it forever. Now ``stop`` ends it at its next pass and starts no run meanwhile."""
    store = CancelSwallowingStore(tmp_path / "cron" / "jobs.json")
    ex = Executor(clock)
    svc = await make(store, clock, ex)
    await svc.add(every(10))
    store.hold = True
    await clock.advance(10)  # due: the timer now waits in the jobs write
    await asyncio.wait_for(svc.stop(), 5)
    assert ex.calls == []
    await clock.advance(60)
    assert ex.calls == []
