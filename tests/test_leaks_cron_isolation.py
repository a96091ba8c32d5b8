"""Issue 8 item 6: every run of an ``isolated`` cron job starts from a fresh context — a
new session id under ``agent:<agent>:cron:<job_id>`` per run — and earlier runs stay
browsable (their transcripts stay on disk and the run log names each run's session id)."""

from __future__ import annotations

import json

import aiohttp
import pytest

from runtime.clock import FakeClock
from tests.channel_harness import run_cli, write_config
from tests.fakes.fake_openai import FakeOpenAI
from tests.scheduler_harness import T0, config, gateway, transcript, until


@pytest.fixture
async def fake():
    async with FakeOpenAI() as server:
        yield server


async def api(gw, method: str, path: str, body=None) -> tuple[int, object]:
    async with aiohttp.ClientSession() as s, s.request(
            method, f"http://127.0.0.1:{gw.port}{path}", json=body,
            headers={"Authorization": f"Bearer {gw.token}"}) as r:
        return r.status, await r.json()


def run_log(gw, job_id: str) -> list[dict]:
    path = gw.state_dir / "cron" / "runs" / f"{job_id}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


async def test_each_isolated_run_gets_a_fresh_session(tmp_path, fake):
    clock = FakeClock(T0)
    cfg = config(tmp_path, fake.base_url)
    async with gateway(cfg, clock) as gw:
        status, job = await api(gw, "POST", "/api/cron", {
            "name": "zebra", "schedule": {"kind": "every", "interval": "4s"},
            "message": "Say one animal.", "session_target": "isolated",
            "delivery": "testchan:1"})
        assert status == 200, job
        key = f"agent:main:cron:{job['id']}"
        for n, word in enumerate(["ZEBRA", "OTTER", "HERON"], start=1):
            fake.script_text(word)
            await clock.advance(4)
            await until(lambda n=n: len(gw.testchan.sent) >= n, what=f"run {n}")
        assert gw.testchan.texts() == ["ZEBRA", "OTTER", "HERON"]
        # Runs 2 and 3 never saw run 1's prompt or answer.
        for req in fake.requests[-2:]:
            msgs = req.json["messages"]
            assert [m["role"] for m in msgs] == ["system", "user"]
            assert "ZEBRA" not in json.dumps(msgs)
        await until(lambda: len(run_log(gw, job["id"])) == 3, what="3 run records")
        ids = [r["session_id"] for r in run_log(gw, job["id"])]
        assert len(set(ids)) == 3 and all(ids)
        assert gw.agents["main"].store.get(key).session_id == ids[-1]
        # Earlier runs stay browsable: each run's transcript is on disk with its answer.
        sessions = gw.state_dir / "agents" / "main" / "sessions"
        for sid, word in zip(ids, ["ZEBRA", "OTTER", "HERON"]):
            rows = [json.loads(x) for x in (sessions / f"{sid}.jsonl").read_text()
                    .splitlines()]
            assert rows[0]["session_key"] == key and rows[0]["id"] == sid
            assert rows[-1]["message"]["content"][0]["text"] == word
        assert transcript(gw, key)[0]["id"] == ids[-1]
        # The API's run log carries them too (what `tidegate cron runs ID` prints).
        status, runs = await api(gw, "GET", f"/api/cron/{job['id']}/runs")
        assert [r["session_id"] for r in runs] == ids
        # ... and `tidegate sessions show <session id>` shows an earlier run.
        code, out, err = await run_cli(write_config(tmp_path, cfg), "sessions", "show",
                                       ids[0])
        assert code == 0, err
        assert f"session_key: {key}" in out and "ZEBRA" in out and "OTTER" not in out
