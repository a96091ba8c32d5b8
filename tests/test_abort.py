"""Abort (issue 10 "Abort and steer"): ``/stop`` on a channel, the control API and the CLI
stop the running turn within 2 s — the exec subprocess group is killed, every started tool
call gets an ``aborted`` result, the timeline records it, queued messages are kept (or
dropped with ``/stop all``)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
import yaml

from gateway.cli.main import main as cli_main
from runtime.lanes import TurnInterrupted
from tests.channel_harness import until
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

SLOW = {"command": "echo $$ > exec.pid; exec sleep 60"}
USER = 4242


def alive(pid: int) -> bool:
    """Running (a killed command's shell may linger as a zombie until init reaps it: it
    runs under exec's sentinel, which dies with it; a zombie runs nothing)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


async def started_exec(ws) -> int:
    pidfile = ws / "exec.pid"
    await until(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=30,
                what="the exec subprocess")
    return int(pidfile.read_text())


def transcript(gw, session_id: str) -> list[dict]:
    path = gw.state_dir / "agents" / "main" / "sessions" / f"{session_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_stop_kills_exec_pairs_tool_calls_and_keeps_queued_messages(tmp_path):
    async with FakeOpenAI() as fake, running_gateway(
            base_config(tmp_path / "state", fake.base_url)) as gw:
        ws = gw.config.workspace_for("main")
        fake.script_tool_calls([{"name": "exec", "arguments": SLOW, "id": "call_slow"},
                                {"name": "read", "arguments": {"path": "x"}, "id": "call_2"}])
        first = gw.local.submit("run the slow thing")
        pid = await started_exec(ws)
        queued = gw.local.submit("and then this")
        fake.script_text("ran the queued one")
        t0 = time.monotonic()
        stop = await gw.local.send("/stop")
        interrupted = await first.future
        elapsed = time.monotonic() - t0
        assert stop.text == "Stopped. 1 queued message will run next."
        assert isinstance(interrupted, TurnInterrupted) and elapsed < 2.0
        await until(lambda: not alive(pid), timeout=2, what="the exec process to be gone")
        after = await queued.future
        assert after.text == "ran the queued one"
        # the provider saw every call paired (the fake rejects unpaired calls with a 400)
        tools = [m for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
        assert [t["tool_call_id"] for t in tools] == ["call_slow", "call_2"]
        assert all(t["content"].startswith("aborted") for t in tools)
        lines = transcript(gw, after.session_id)
        results = [e["message"] for e in lines if e.get("type") == "message"
                   and e["message"]["role"] == "toolResult"]
        assert [(r["toolCallId"], r.get("aborted")) for r in results] == [
            ("call_slow", True), ("call_2", True)]
        await gw.timeline_hooks.flush()
        events = await gw.timeline_hooks.timeline.get_timeline(after.session_id)
        aborted = [e.content for e in events if e.event_type == "SYSTEM_EVENT"
                   and e.content.get("kind") == "turn_aborted"]
        assert aborted and aborted[0]["reason"] == "stop"
        assert aborted[0]["tool_calls_aborted"] == ["call_slow", "call_2"]


async def test_stop_all_drops_queued_messages_and_the_api_and_cli_abort(tmp_path):
    async with FakeOpenAI() as fake, running_gateway(
            base_config(tmp_path / "state", fake.base_url)) as gw:
        ws = gw.config.workspace_for("main")
        fake.script_tool_call("exec", SLOW)
        first = gw.local.submit("slow")
        await started_exec(ws)
        q1, q2 = gw.local.submit("one"), gw.local.submit("two")
        stop = await gw.local.send("/stop all")
        assert stop.text == "Stopped. Dropped 2 queued messages."
        for f in (first, q1, q2):
            assert isinstance(await f.future, TurnInterrupted)
        requests_after = len(fake.requests)
        assert (await gw.local.send("/stop")).text == "Nothing is running."

        (ws / "exec.pid").unlink()
        fake.script_tool_call("exec", SLOW)
        sub = gw.local.submit("slow again")
        pid = await started_exec(ws)
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{gw.port}/api/sessions/{sub.session_key}/abort"
            async with http.post(url, json={}, headers={
                    "Authorization": f"Bearer {gw.token}"}) as resp:
                body = await resp.json()
        assert body == {"ok": True, "session_key": sub.session_key, "aborted": True,
                        "queued": 0, "dropped": 0}
        assert isinstance(await sub.future, TurnInterrupted)
        await until(lambda: not alive(pid), timeout=2, what="the exec process to be gone")
        assert len(fake.requests) == requests_after + 1

        (ws / "exec.pid").unlink()
        fake.script_tool_call("exec", SLOW)
        sub = gw.local.submit("and once more")
        await started_exec(ws)
        cfg_path = tmp_path / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(base_config(tmp_path / "state", fake.base_url)))
        code = await asyncio.to_thread(cli_main, ["--config", str(cfg_path), "sessions",
                                                       "abort", sub.session_key])
        assert code == 0 and isinstance(await sub.future, TurnInterrupted)


@pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")
async def test_stop_on_telegram_stops_the_turn(tmp_path):
    tg = await FakeTelegram().start()
    try:
        async with FakeOpenAI() as fake:
            section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                       "poll_timeout": 1, "dm_policy": "open"}
            cfg = base_config(tmp_path / "state", fake.base_url,
                              channels={"telegram": section})
            async with running_gateway(cfg) as gw:
                ws = gw.config.workspace_for("main")
                fake.script_tool_call("exec", SLOW)
                tg.inject_message("do the slow thing", chat_id=USER, user_id=USER)
                pid = await started_exec(ws)
                t0 = time.monotonic()
                tg.inject_message("/stop", chat_id=USER, user_id=USER)
                await until(lambda: [m for m in tg.bot_messages(USER)
                                     if m["text"].startswith("Stopped")], what="the reply")
                await until(lambda: not alive(pid), timeout=2, what="exec to be gone")
                assert time.monotonic() - t0 < 2.0
                key = f"agent:main:telegram:dm:{USER}"
                await until(lambda: not gw.lanes.is_running(key), what="the lane to idle")
    finally:
        await tg.stop()


async def test_stop_during_a_model_call_closes_the_request(tmp_path):
    async with FakeOpenAI() as fake, running_gateway(
            base_config(tmp_path / "state", fake.base_url)) as gw:
        fake.script_hang()
        sub = gw.local.submit("think hard")
        await until(lambda: fake.requests, what="the model request")
        t0 = time.monotonic()
        assert (await gw.local.send("/stop")).text == "Stopped."
        assert isinstance(await sub.future, TurnInterrupted)
        assert time.monotonic() - t0 < 2.0
        fake.script_text("fresh start")
        assert (await gw.local.send("hello")).text == "fresh start"


async def test_a_steered_message_is_journaled_with_the_turn_that_took_it(tmp_path):
    """A Telegram message steered into a running turn (during its exec tool call) reaches
    the turn's next model call after the tool result, and is journaled as that turn's:
    ``start`` with its run id, then its ``reply`` and ``done`` with the turn's reply. A
    crash after the steer resumes it like the turn (here ``continue``: exec had begun),
    never as a fresh message that would be answered twice."""
    from gateway.journal.resume import resume_action
    from gateway.journal.store import FILE_NAME, IntakeJournal
    from runtime.clock import SYSTEM_CLOCK
    tg = await FakeTelegram().start()
    try:
        async with FakeOpenAI() as fake:
            section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                       "poll_timeout": 1, "dm_policy": "open"}
            cfg = base_config(tmp_path / "state", fake.base_url,
                              channels={"telegram": section},
                              messages={"queue": {"mode": "steer", "debounce": 0}})
            async with running_gateway(cfg) as gw:
                ws = gw.config.workspace_for("main")
                key = f"agent:main:telegram:dm:{USER}"
                wait = {"command": "echo $$ > exec.pid; while [ ! -f go ]; do sleep 0.05; "
                                   "done"}
                fake.script_tool_call("read", {"path": "nothing-here.md"})
                fake.script_tool_call("exec", wait)
                fake.script_text("done, in metric units", delay=1.0)
                tg.inject_message("start", chat_id=USER, user_id=USER)
                await started_exec(ws)
                tg.inject_message("actually, use metric units", chat_id=USER, user_id=USER)
                await until(lambda: gw.lanes._lanes[key].control._steer,
                            what="the steer to reach the running turn")
                (ws / "go").write_text("")
                path = gw.state_dir / FILE_NAME
                await until(lambda: len(fake.requests) == 3, what="the third model call")
                await asyncio.sleep(0.3)  # the round is running: a crash would land here
                snapshot = tmp_path / "crash.jsonl"
                snapshot.write_bytes(path.read_bytes())
                await until(lambda: [m for m in tg.bot_messages(USER)
                                     if m["text"] == "done, in metric units"],
                            what="the reply")
                await until(lambda: not gw.lanes.is_running(key), what="the lane to idle")
                records = [json.loads(line) for line in path.read_text().splitlines()]
    finally:
        await tg.stop()
    msgs = fake.requests[2].json["messages"]  # the steer reached the next model call
    tool_at = max(i for i, m in enumerate(msgs) if m["role"] == "tool")
    assert msgs[tool_at + 1]["role"] == "user"
    assert msgs[tool_at + 1]["content"].endswith("actually, use metric units")
    crashed = IntakeJournal(snapshot, SYSTEM_CLOCK)
    first, steered = sorted(crashed.load(), key=lambda e: e.accepted_at)
    assert steered.work["text"] == "actually, use metric units"
    assert steered.started and steered.run_id == first.run_id
    assert resume_action(steered) == resume_action(first) != "run"
    crashed.close()
    assert steered.tools == first.tools == ["exec"]  # joined after exec began
    ops = [r["op"] for r in records if r.get("id") == steered.id]
    # a streamed reply is marked before its first piece and again with its final text
    assert ops[:3] == ["accept", "start", "tool"] and ops[-1] == "done", ops
    assert set(ops[3:-1]) == {"reply"} and len(ops[3:-1]) in (1, 2), ops
