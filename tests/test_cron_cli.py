"""``tidegate cron`` / ``system event`` / ``heartbeat now`` (issue 4 CLI): directly on the
store while the gateway is down (under its lock), through the control API while it runs."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import threading
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
import yaml

from gateway.cli import main
from gateway.cli.output import format_duration
from runtime.clock import FakeClock, parse_iso, utc_iso
from scheduler.cron.job import new_job
from scheduler.cron.store import CronStore
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import ROOT, base_config
from tests.scheduler_harness import T0, events_section, gateway, until

JOB_KEYS = {"id", "name", "enabled", "schedule", "session_target", "next_run_at",
            "last_run_at", "last_status"}


@pytest.fixture
def offline(tmp_path, capsys):
    """A config file whose gateway is not running; ``run(*args)`` -> (code, out, err)."""
    cfg = base_config(tmp_path / "state")
    cfg["agents"] = {"defaults": {"user_timezone": "Europe/Berlin"}}
    cfg["channels"] = {"telegram": {"enabled": True, "token": "1:x",
                                    "api_base_url": "http://127.0.0.1:9/bot"}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))

    class Offline:
        state = tmp_path / "state"
        store = CronStore(tmp_path / "state" / "cron" / "jobs.json")

        def run(self, *args: str) -> tuple[int, str, str]:
            capsys.readouterr()
            code = main(["--config", str(path), *args])
            out = capsys.readouterr()
            return code, out.out, out.err

        def jobs(self) -> list[dict]:
            return json.loads(self.store.path.read_text())["jobs"]

    return Offline()


# -- offline: the store directly -------------------------------------------------------------

def test_offline_add_list_and_json_shape(offline):
    code, out, err = offline.run("cron", "add", "--name", "standup", "--cron", "0 9 * * 1-5",
                                 "--tz", "Europe/Berlin", "--message", "prepare the standup",
                                 "--json")
    assert code == 0, err
    job = json.loads(out)
    assert JOB_KEYS <= set(job)
    assert job["schedule"] == {"kind": "cron", "expr": "0 9 * * 1-5", "tz": "Europe/Berlin"}
    assert job["session_target"] == "main" and job["agent"] == "main"
    local = datetime.fromtimestamp(parse_iso(job["next_run_at"]), ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (9, 0) and local.weekday() < 5
    assert parse_iso(job["next_run_at"]) > time.time()

    before = time.time()
    code, out, _ = offline.run("cron", "add", "--name", "stretch", "--at", "20m",
                               "--message", "stretch", "--session", "isolated",
                               "--deliver", "telegram:42", "--json")
    once = json.loads(out)
    assert code == 0 and once["delete_after_run"] is True and once["delivery"] == "telegram:42"
    assert before + 1200 <= parse_iso(once["next_run_at"]) <= time.time() + 1201
    assert offline.run("cron", "add", "--name", "poll", "--every", "90m", "--message", "poll",
                       "--timeout", "2m")[0] == 0
    code, _, err = offline.run("cron", "add", "--name", "x", "--every", "1h", "--message", "m",
                               "--deliver", "slack:C1")
    assert code != 0 and "channel 'slack' is not enabled" in err

    assert [j["name"] for j in offline.jobs()] == ["standup", "stretch", "poll"]
    code, out, _ = offline.run("cron", "list", "--json")
    listed = json.loads(out)
    assert [j["id"] for j in listed] == [j["id"] for j in offline.jobs()]
    for j in listed:
        assert JOB_KEYS <= set(j)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", j["next_run_at"])
        assert j["last_run_at"] is None and j["last_status"] is None
    assert listed[2]["timeout"] == 120 and listed[2]["schedule"]["interval"] == 5400

    code, out, _ = offline.run("cron", "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["ID", "NAME", "ON", "SCHEDULE"]
    standup = next(ln for ln in lines if "standup" in ln)
    assert re.search(r"09:00 CES?T \(Europe/Berlin\)", standup)  # the job's own zone
    assert "every 1h30m" in next(ln for ln in lines if "poll" in ln)
    assert "gateway not running" in lines[-1]


def test_offline_enable_disable_rm_and_runs(offline):
    code, out, _ = offline.run("cron", "add", "--name", "poll", "--every", "1h", "--message",
                               "poll", "--json")
    job = json.loads(out)
    jid = job["id"]
    code, out, _ = offline.run("cron", "disable", jid, "--json")
    assert code == 0 and json.loads(out)["enabled"] is False
    assert offline.jobs()[0]["enabled"] is False and offline.jobs()[0]["next_run_at"] is None
    assert "- (disabled)" in offline.run("cron", "list")[1]
    code, out, _ = offline.run("cron", "enable", jid)
    assert code == 0 and "enabled" in out
    assert offline.jobs()[0]["enabled"] is True and offline.jobs()[0]["next_run_at"]

    assert offline.run("cron", "runs", jid)[1].strip() == f"cron job {jid} has not run yet"
    offline.store.append_run(jid, {"job_id": jid, "started_at": utc_iso(T0),
                                   "finished_at": utc_iso(T0 + 2), "status": "error",
                                   "error": "model down", "duration_ms": 2000,
                                   "delivered": False})
    code, out, _ = offline.run("cron", "runs", jid, "--json")
    assert code == 0 and [r["status"] for r in json.loads(out)] == ["error"]
    out = offline.run("cron", "runs", jid)[1]
    assert "error" in out and "2.0s" in out and "model down" in out

    code, out, _ = offline.run("cron", "rm", jid)
    assert code == 0 and offline.jobs() == []
    code, _, err = offline.run("cron", "rm", jid)
    assert code == 1 and f"no cron job with id {jid!r}" in err
    assert offline.run("cron", "enable", "nope")[0] == 1


@pytest.mark.parametrize("args,message", [
    (["--cron", "61 * * * *"], "error: schedule"),
    (["--every", "soon"], "error: schedule.interval"),
    (["--at", "yesterday"], "error: schedule.at"),
    (["--at", "2020-01-01T00:00:00Z"], "is in the past"),
    (["--every", "1h", "--tz", "UTC"], "--tz only applies to --cron"),
    (["--every", "1h", "--agent", "ghost"], "error: agent: unknown agent"),
    (["--every", "1h", "--deliver", "telegram"], "error: delivery"),
    (["--every", "1h", "--to", "telegram"], "error: delivery"),
    (["--every", "1h", "--session", "isolated", "--deliver", "last"],
     "error: delivery: 'last' is no longer accepted"),
    (["--every", "1h", "--session", "isolated", "--deliver", "origin"],
     "error: delivery: origin: this job is not created from a chat"),
    (["--every", "1h", "--timeout", "long"], "error: timeout"),
])
def test_offline_add_rejects_bad_input(offline, args, message):
    code, out, err = offline.run("cron", "add", "--name", "x", "--message", "m", *args)
    assert code == 2 and message in err and out == ""
    assert not offline.store.path.exists()


def test_offline_delivery_targets_and_a_stored_last(offline):
    """``cron add`` says where the reply goes; a job stored with ``last`` by an older
    version delivers nowhere, and ``cron list`` warns until ``--to`` names a target."""
    code, out, err = offline.run("cron", "add", "--name", "digest", "--every", "1h",
                                 "--message", "m", "--session", "isolated")
    assert code == 0, err
    [line] = out.splitlines()
    jid = line.split()[3]
    assert line.endswith(f"; delivers nowhere (no target: tidegate cron edit {jid} --to "
                         "<channel>:<to>) (gateway not running: saved to jobs.json)")
    code, out, _ = offline.run("cron", "add", "--name", "stretch", "--at", "20m", "--message",
                               "m", "--session", "isolated", "--to", "telegram:42:7")
    assert code == 0 and "; delivers to telegram:42:7 (gateway" in out
    code, out, _ = offline.run("cron", "add", "--name", "standup", "--every", "1d",
                               "--message", "m")
    assert code == 0 and "; delivers via the heartbeat (main session) (gateway" in out
    legacy = new_job(name="old", schedule={"kind": "every", "interval": 3600}, message="m",
                     now=time.time(), session_target="isolated", delivery="last")
    with offline.store.transaction() as jobs:
        jobs.append(legacy)
    assert offline.jobs()[-1]["delivery"] == "last"  # kept as stored

    code, out, err = offline.run("cron", "list")
    assert code == 0
    rows = {ln.split()[0]: ln for ln in out.splitlines()[1:-1]}
    header = out.splitlines()[0]
    col = header.index("DELIVERS TO")
    assert {k: v[col:].split()[0] for k, v in rows.items()} == {
        jid: "nowhere", offline.jobs()[1]["id"]: "telegram:42:7",
        offline.jobs()[2]["id"]: "heartbeat", legacy.id: "nowhere"}
    assert err == (f"warning: delivery 'last' (from an older version) no longer follows "
                   f"whichever chat spoke most recently; this job delivers nowhere until a "
                   f"target is set: tidegate cron edit {legacy.id} --to <channel>:<to>\n")
    code, out, _ = offline.run("cron", "list", "--json")
    listed = {j["id"]: j for j in json.loads(out)}
    assert [listed[k]["deliver_to"] for k in (jid, legacy.id)] == [None, None]
    assert listed[offline.jobs()[1]["id"]]["deliver_to"] == "telegram:42:7"
    assert "delivery_warning" in listed[legacy.id] and "delivery_warning" not in listed[jid]
    assert "deliver_to" not in offline.jobs()[0]  # computed, never stored

    code, out, err = offline.run("cron", "edit", legacy.id, "--name", "older")
    assert code == 0 and "delivers nowhere" in out and "no longer follows" in err
    code, out, err = offline.run("cron", "edit", legacy.id, "--to", "telegram:42")
    assert code == 0 and "; delivers to telegram:42" in out and err == ""
    assert offline.jobs()[-1]["delivery"] == "telegram:42"
    assert offline.run("cron", "list")[2] == ""  # no warning left


def test_commands_that_need_the_gateway_say_so(offline):
    code, _, err = offline.run("cron", "run", "abc")
    assert code == 1 and "needs the running gateway" in err
    code, _, err = offline.run("system", "event", "--text", "hello")
    assert code == 1 and "system events live in the gateway's memory" in err
    code, _, err = offline.run("heartbeat", "now")
    assert code == 1 and "the heartbeat runs inside the gateway" in err


def test_offline_edit_holds_the_store_lock(offline):
    """A concurrent writer holding the lock is waited for: no update is lost."""
    holding, store = threading.Event(), CronStore(offline.store.path)

    def holder() -> None:
        with store.transaction() as jobs:
            jobs.append(new_job(name="from-another-process", message="m", now=time.time(),
                                schedule={"kind": "every", "interval": 60}))
            holding.set()
            time.sleep(0.3)

    t = threading.Thread(target=holder)
    t.start()
    holding.wait(5)
    assert offline.run("cron", "add", "--name", "cli", "--every", "1h",
                       "--message", "m")[0] == 0
    t.join()
    assert [j["name"] for j in offline.jobs()] == ["from-another-process", "cli"]


def test_corrupt_store_is_reported_not_overwritten(offline):
    offline.store.path.parent.mkdir(parents=True)
    offline.store.path.write_text("{not json")
    code, _, err = offline.run("cron", "add", "--name", "x", "--every", "1h", "--message", "m")
    assert code == 1 and "not valid JSON" in err
    assert offline.run("cron", "list")[0] == 1
    assert offline.store.path.read_text() == "{not json"


def test_format_duration():
    assert [format_duration(s) for s in (0.5, 45, 90, 3600, 5400, 86400 + 60)] == \
        ["500ms", "45s", "1m30s", "1h", "1h30m", "1d1m"]


# -- online: through the control API ---------------------------------------------------------

async def cli(cfg_path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "--config", str(cfg_path), *args, cwd=ROOT,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_cli_through_the_running_gateway(tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        cfg = base_config(tmp_path / "state", fake.base_url)
        cfg["agents"]["defaults"]["heartbeat"] = {"every": "100h", "target": "testchan:1"}
        cfg["agents"]["list"] = [{"id": "main"}, {"id": "quiet", "heartbeat": None}]
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        async with gateway(cfg, clock) as gw:
            code, out, err = await cli(path, "cron", "add", "--name", "digest", "--every",
                                       "1h", "--message", "summarise the day", "--session",
                                       "isolated", "--deliver", "testchan:5", "--json")
            assert code == 0, err
            job = json.loads(out)
            jid = job["id"]
            # Added by the daemon (its clock, its service), not behind its back.
            assert job["next_run_at"] == utc_iso(T0 + 3600)
            assert [j.id for j in await gw.scheduling.cron.list()] == [jid]

            code, out, _ = await cli(path, "cron", "list", "--json")
            [listed] = json.loads(out)
            assert JOB_KEYS <= set(listed) and listed["id"] == jid
            code, out, _ = await cli(path, "cron", "list")
            row = next(ln for ln in out.splitlines() if jid in ln)
            assert "every 1h" in row and "2026-01-01 01:00 UTC" in row
            assert "gateway not running" not in out

            fake.script_text("Digest: a quiet day.")
            code, out, err = await cli(path, "cron", "run", jid)
            assert code == 0, err
            assert out.strip() == f"ran cron job {jid}: ok (delivered)"
            assert gw.testchan.texts() == ["Digest: a quiet day."]
            code, out, _ = await cli(path, "cron", "runs", jid, "--json")
            [run] = json.loads(out)
            assert (run["status"], run["manual"], run["delivered"]) == ("ok", True, True)

            assert (await cli(path, "cron", "disable", jid))[0] == 0
            assert (await gw.scheduling.cron.get(jid)).enabled is False
            assert (await cli(path, "cron", "enable", jid))[0] == 0
            assert (await gw.scheduling.cron.get(jid)).enabled is True
            code, _, err = await cli(path, "cron", "add", "--name", "bad", "--cron",
                                     "* * * *", "--message", "m")
            assert code == 2 and "error: schedule" in err
            assert (await cli(path, "cron", "rm", jid))[0] == 0
            assert await gw.scheduling.cron.list() == []
            code, _, err = await cli(path, "cron", "rm", jid)
            assert code == 1 and "no cron job" in err
            assert json.loads((gw.state_dir / "cron" / "jobs.json").read_text())["jobs"] == []

            # system event --wake now: the heartbeat runs with the event in its prompt.
            fake.script_text("Deploy finished, 2 warnings.")
            code, out, err = await cli(path, "system", "event", "--text", "deploy finished",
                                       "--wake", "now")
            assert code == 0, err
            assert "queued for agent:main:main (wake: now)" in out
            runner = gw.scheduling.heartbeat
            await clock.advance(0.25)
            await until(lambda: runner.outcomes)
            assert runner.outcomes[-1].outcome == "delivered"
            assert events_section(fake.requests[-1])[-1].endswith("(cli) deploy finished")
            code, _, err = await cli(path, "system", "event", "--text", "x", "--session",
                                     "agent:ghost:main")
            assert code == 2 and "unknown agent" in err

            fake.script_text("HEARTBEAT_OK")
            code, out, _ = await cli(path, "heartbeat", "now")
            assert code == 0 and "heartbeat requested for agent main" in out
            await clock.advance(0.25)
            await until(lambda: len(runner.outcomes) == 2)
            code, _, err = await cli(path, "heartbeat", "now", "--agent", "quiet")
            assert code == 1 and "has no enabled heartbeat" in err


async def test_cron_run_says_where_the_reply_went_and_events_need_a_session(tmp_path):
    """Issue 14 points 4 and 6: a reply that went nowhere is printed with the reason, not a
    bare ``ok``; a system event for a session that does not exist is refused."""
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        cfg = base_config(tmp_path / "state", fake.base_url)
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        async with gateway(cfg, clock):
            code, out, err = await cli(path, "cron", "add", "--name", "digest", "--every",
                                       "1h", "--message", "summarise", "--session",
                                       "isolated", "--json")
            assert code == 0, err
            jid = json.loads(out)["id"]
            fake.script_text("Digest: nothing happened.")
            code, out, err = await cli(path, "cron", "run", jid)
            assert code == 0, err
            why = (f"the job has no delivery target (set one with `tidegate cron edit {jid} "
                   f"--to <channel>:<to>`)")
            assert out.splitlines() == [f"ran cron job {jid}: ok (not delivered: {why})",
                                        "Digest: nothing happened."]
            code, out, _ = await cli(path, "cron", "run", jid, "--json")
            got = json.loads(out)
            assert got["delivered"] is False and got["reply"] and got["not_delivered"]

            code, out, err = await cli(path, "system", "event", "--text", "x", "--session",
                                       "agent:main:telegram:dm:nobody")
            assert code == 1 and "queued" not in out
            assert "no session agent:main:telegram:dm:nobody" in err


def test_edit_refuses_tz_without_a_cron_schedule_as_add_does(offline):
    """``cron edit --at ... --tz Europe/Oslo`` stored the time as UTC and dropped --tz."""
    assert offline.run("cron", "add", "--name", "x", "--every", "1h", "--message", "m")[0] == 0
    job_id = offline.jobs()[0]["id"]
    for flags in (["--at", "2h", "--tz", "Europe/Oslo"], ["--every", "2h", "--tz", "UTC"]):
        code, out, err = offline.run("cron", "edit", job_id, *flags)
        assert code == 2 and "--tz only applies to --cron" in err and out == ""
    assert offline.jobs()[0]["schedule"]["kind"] == "every"  # unchanged
    code, _, err = offline.run("cron", "edit", job_id, "--cron", "0 9 * * *", "--tz",
                               "Europe/Oslo")
    assert code == 0, err
    assert offline.jobs()[0]["schedule"] == {"kind": "cron", "expr": "0 9 * * *",
                                             "tz": "Europe/Oslo"}
