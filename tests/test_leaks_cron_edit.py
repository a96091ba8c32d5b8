"""Issue 8 item 11 (second half): ``tidegate cron edit ID [--schedule|--every|--at|--tz|
--message|--session|--deliver]``. Through the running gateway (the real CLI process, the
control API, a FakeClock) the edit applies at once and the old schedule never fires again;
with the gateway down it edits ``jobs.json`` under its lock."""

from __future__ import annotations

import json

import yaml

from runtime.clock import FakeClock, utc_iso
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config
from tests.scheduler_harness import T0, gateway, until
from tests.test_cron_cli import cli


def run_log(gw, job_id: str) -> list[dict]:
    path = gw.state_dir / "cron" / "runs" / f"{job_id}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def test_edit_through_the_running_gateway_never_fires_the_old_schedule(tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        cfg = base_config(tmp_path / "state", fake.base_url)
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        async with gateway(cfg, clock) as gw:
            code, out, err = await cli(path, "cron", "add", "--name", "digest", "--every",
                                       "1h", "--message", "old text", "--session",
                                       "isolated", "--deliver", "testchan:5", "--json")
            assert code == 0, err
            jid = json.loads(out)["id"]
            await clock.advance(300)  # 00:05
            code, out, err = await cli(path, "cron", "edit", jid, "--schedule", "30 * * * *",
                                       "--tz", "Europe/Berlin", "--message", "new text",
                                       "--deliver", "testchan:7", "--json")
            assert code == 0, err
            job = json.loads(out)
            assert job["schedule"] == {"kind": "cron", "expr": "30 * * * *",
                                       "tz": "Europe/Berlin"}
            assert job["next_run_at"] == utc_iso(T0 + 1800)
            # Advance to 00:35, then to 01:35: 00:30 and 01:30 run; the old 01:00 does not.
            for n, step in ((1, 1800), (2, 3600)):
                fake.script_text(f"run {n}")
                await clock.advance(step)
                await until(lambda n=n: len(gw.testchan.sent) >= n, what=f"run {n}")
            await clock.advance(1)
            assert [r["due_at"] for r in run_log(gw, jid)] == \
                [utc_iso(T0 + 1800), utc_iso(T0 + 5400)]
            assert [m.to for m in gw.testchan.sent] == ["7", "7"]
            assert all(r.json["messages"][-1]["content"].endswith("new text")
                       for r in fake.requests)
            # --tz alone re-zones the current crontab; --every switches the kind.
            code, out, err = await cli(path, "cron", "edit", jid, "--tz", "UTC", "--json")
            assert code == 0 and json.loads(out)["schedule"]["tz"] == "UTC", err
            code, out, err = await cli(path, "cron", "edit", jid, "--every", "10m",
                                       "--session", "main", "--json")
            assert code == 0, err
            job = json.loads(out)
            assert job["session_target"] == "main"
            assert job["next_run_at"] == utc_iso(clock.time() + 600)
            code, _, err = await cli(path, "cron", "edit", jid, "--tz", "Europe/Berlin")
            assert code == 2 and "tz" in err  # an interval has no zone
            code, _, err = await cli(path, "cron", "edit", jid, "--schedule", "* * *")
            assert code == 2 and "schedule" in err
            code, _, err = await cli(path, "cron", "edit", jid)
            assert code == 2 and "nothing to change" in err
            code, _, err = await cli(path, "cron", "edit", "nosuchjob", "--message", "x")
            assert code == 1 and "no cron job" in err
        on_disk = json.loads((gw.state_dir / "cron" / "jobs.json").read_text())["jobs"]
        assert on_disk[0]["schedule"]["kind"] == "every"


async def test_edit_while_the_gateway_is_down(tmp_path):
    cfg = base_config(tmp_path / "state")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, out, err = await cli(path, "cron", "add", "--name", "n", "--every", "1h",
                               "--message", "m", "--json")
    assert code == 0, err
    jid = json.loads(out)["id"]
    code, out, err = await cli(path, "cron", "edit", jid, "--at", "20m", "--message", "later")
    assert code == 0 and "gateway not running" in out, err
    [job] = json.loads((tmp_path / "state" / "cron" / "jobs.json").read_text())["jobs"]
    assert job["schedule"]["kind"] == "at" and job["payload"]["message"] == "later"
