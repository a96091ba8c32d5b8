"""Subagents through the whole gateway against the fake model, on a FakeClock (issue 11
"How it is proven"): spawn in parallel with the parent, announce and relay to the user's
chat, announce retries with a failing delivery, expiry at 5 and 30 minutes, an orphan
after /new, a restart with a run in flight, a corrupt runs.json, depth and count limits,
the CLI and /subagents."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from channels.base import DeliveryResult, InboundMessage
from gateway.cli.main import main as cli_main
from gateway.config.load import parse_config
from gateway.service.daemon import Gateway
from runtime.clock import FakeClock
from runtime.subagents.announce import ANNOUNCE_PROMPT
from tests.fakes.fake_openai import FakeOpenAI
from tests.scheduler_harness import T0, RecordingChannel, config, until

USER_KEY = "agent:main:testchan:dm:u1"


class Script:
    """A responder for the fake model that answers by role: the parent's user turns, the
    child runs (``Subagent run`` in the environment) and announce turns."""

    def __init__(self) -> None:
        self.parent: dict[str, list[Any]] = {}
        self.child: Any = {"type": "text", "text": "High tide at 06:12."}
        self.announce = lambda events: "Your helper says: " + events

    def __call__(self, body: dict[str, Any]) -> Any:
        system = body["messages"][0]["content"]
        last = body["messages"][-1]
        if "Subagent run: " in system:
            return self.child(body) if callable(self.child) else self.child
        users = [m for m in body["messages"] if m["role"] == "user"]
        if users and users[-1]["content"] == ANNOUNCE_PROMPT and last["role"] == "user":
            head = "## Runtime System Events (gateway-generated)"
            if head not in system:  # an earlier announce turn took this event along
                return "HEARTBEAT_OK"
            line = next(ln for ln in system.split(head)[1].splitlines()
                        if "Subagent run" in ln)
            return self.announce(line.split("Result: ", 1)[-1])
        steps = self.parent.get(users[-1]["content"] if users else "", [])
        done = sum(1 for m in body["messages"][body["messages"].index(users[-1]):]
                   if m["role"] == "tool")
        return steps[done] if done < len(steps) else None


def spawn_call(**args: Any) -> dict[str, Any]:
    return {"type": "tool_calls", "calls": [{"name": "sessions_spawn",
                                              "arguments": {"task": "find tide tables",
                                                            **args}}]}


@pytest.fixture
async def fake():
    async with FakeOpenAI() as server:
        server.script = Script()
        server.responder = server.script
        yield server


@contextlib.asynccontextmanager
async def gateway_on(cfg: dict, clock: FakeClock, channel: Any = None) -> AsyncIterator[Gateway]:
    gw = Gateway(parse_config(cfg, "test", env={}), clock=clock)
    await gw.start()
    gw.testchan = channel or RecordingChannel()
    gw.deliverer.register(gw.testchan)
    try:
        yield gw
    finally:
        stop = asyncio.get_running_loop().create_task(gw.stop())
        while not stop.done():  # drain waits on the fake clock: move it along
            await clock.advance(1)
            await asyncio.sleep(0.01)
        await stop


async def user_says(gw: Gateway, text: str) -> None:
    await gw.intake.on_message(InboundMessage(channel="testchan", text=text, sender_id="u1",
                                              peer_id="u1", chat_type="dm"))


def runs_json(gw: Gateway) -> dict[str, dict]:
    data = json.loads((gw.state_dir / "subagents" / "runs.json").read_text())
    return {r["run_id"]: r for r in data["runs"]}


def only_run(gw: Gateway):
    [rec] = gw.subagents.service.records.values()
    return rec


def sub_config(tmp_path, fake, **subagents: Any) -> dict:
    cfg = config(tmp_path, fake.base_url)
    cfg["agents"]["defaults"]["timeout"] = "3h"  # only the subagent expiries apply
    cfg["models"]["timeout"] = "3h"
    cfg["agents"]["defaults"]["subagents"] = subagents
    return cfg


async def test_spawn_runs_in_parallel_announces_and_the_parent_relays(tmp_path, fake):
    fake.script.parent["research tides"] = [spawn_call(label="tides"),
                                            "I started a helper on the tide tables."]
    fake.script.child = {"type": "text", "text": "High tide at 06:12.", "delay": 0.6}
    clock = FakeClock(T0)
    async with gateway_on(sub_config(tmp_path, fake), clock) as gw:
        await user_says(gw, "research tides")
        await until(lambda: gw.testchan.texts(), what="the parent's reply")
        rec = only_run(gw)
        assert rec.status == "running" and rec.label == "tides"
        assert rec.child_session_key.startswith("agent:main:subagent:")
        await user_says(gw, "still there?")  # the parent's lane is free: answered now
        await until(lambda: len(gw.testchan.texts()) == 2)
        assert rec.active  # the child is still running
        await until(lambda: len(gw.testchan.texts()) == 3, what="the relay")
        assert gw.testchan.texts() == ["I started a helper on the tide tables.",
                                       "echo: still there?",
                                       'Your helper says: "High tide at 06:12."']
        assert gw.testchan.sent[2].to == "u1"
        await until(lambda: rec.announce_state == "announced")
        stored = runs_json(gw)[rec.run_id]
        assert stored["outcome"] == {"status": "ok", "text": "High tide at 06:12."}
        assert stored["requester_session_key"] == USER_KEY
        assert stored["announce_retry_count"] == 0 and stored["ended_at"].endswith("Z")
        child_req = next(r for r in fake.requests
                         if "Subagent run: " in r.json["messages"][0]["content"])
        tools = [t["function"]["name"] for t in child_req.json["tools"]]
        assert "read" in tools and not {"sessions_spawn", "cron", "message"} & set(tools)
        assert child_req.json["messages"][-1]["content"] == "find tide tables"
        await gw.timeline_hooks.flush()
        tl = gw.timeline_hooks.timeline
        parent = await tl.get_timeline(gw.agents["main"].store.get(USER_KEY).session_id)
        types = [e.event_type for e in parent]
        assert "SUBAGENT_SPAWN" in types and "SUBAGENT_ANNOUNCE" in types
        spawn = next(e for e in parent if e.event_type == "SUBAGENT_SPAWN")
        assert spawn.content["run_id"] == rec.run_id
        child = await tl.get_timeline(gw.agents["main"].store.get(
            rec.child_session_key).session_id)
        assert [e.event_type for e in child][:2] == ["SESSION_CREATE", "USER_INPUT"]
        assert (await tl.verify()).ok


class FlakyChannel(RecordingChannel):
    """Fails the first ``failures`` subagent relays (retryable, like a 5xx)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.attempts = 0

    async def send(self, message):
        if message.kind == "subagent":
            self.attempts += 1
            if self.attempts <= self.failures:
                return DeliveryResult(ok=False, error="503 from platform", retryable=True)
        return await super().send(message)


def announce_turns(fake) -> int:
    """Model calls of announce turns (the prompt that wakes the requester session)."""
    return sum(1 for r in fake.requests if r.json and any(
        m["role"] == "user" and m["content"] == ANNOUNCE_PROMPT
        for m in r.json["messages"][-1:]))


async def test_a_failing_delivery_is_retried_by_the_outbox_not_by_a_new_turn(tmp_path,
                                                                            fake):
    """Two failed deliveries of the relay used to mean three announce turns, and the two
    undelivered replies stayed in the transcript; now one turn runs and the outbox retries
    the send (5 s, then 30 s) until it arrives, once."""
    fake.script.parent["research tides"] = [spawn_call(), "Started."]
    clock = FakeClock(T0)
    chan = FlakyChannel(2)
    with capture_logs() as logs:
        async with gateway_on(sub_config(tmp_path, fake), clock, chan) as gw:
            await user_says(gw, "research tides")
            await until(lambda: chan.attempts == 1, what="the first relay")
            rec = only_run(gw)
            await until(lambda: rec.announce_state == "announced", what="announced")
            assert gw.outbox.pending() == 1
            for delay in (5, 30):
                await clock.advance(delay)
                await until(lambda: chan.attempts >= 2, what="an outbox attempt")
            await until(lambda: chan.texts("subagent"), what="the relay")
            assert chan.texts("subagent") == ['Your helper says: "High tide at 06:12."']
            assert chan.attempts == 3 and gw.outbox.pending() == 0
            assert rec.announce_retry_count == 0
            assert announce_turns(fake) == 1
    assert not [r for r in logs if r["event"] == "subagent_announce_retry"]


async def test_a_failing_announce_turn_is_retried_with_backoff(tmp_path, fake):
    """When the announce turn itself fails (the model is down), it is run again after 1 s,
    2 s, 4 s; after 3 retries the outcome goes to the outbox, never silently lost."""
    fake.script.parent["research tides"] = [spawn_call(), "Started."]
    fake.script.announce = lambda events: {"type": "error", "status": 400,
                                           "message": "model unavailable"}
    clock = FakeClock(T0)
    with capture_logs() as logs:
        async with gateway_on(sub_config(tmp_path, fake), clock) as gw:
            await user_says(gw, "research tides")
            def retried() -> int:
                return sum(r["event"] == "subagent_announce_retry" for r in logs)

            await until(lambda: retried() == 1, what="the first announce turn failed")
            assert announce_turns(fake) == 1
            rec = only_run(gw)
            for n, delay in enumerate((1, 2, 4), start=1):
                await clock.advance(delay - 0.01)
                await asyncio.sleep(0.05)
                assert retried() == n  # not before the backoff delay
                await clock.advance(0.01)
                if n < 3:
                    await until(lambda n=n: retried() == n + 1, what=f"attempt {n + 2}")
            await until(lambda: rec.announce_state == "failed")
            assert rec.announce_retry_count == 3
            assert gw.outbox.pending() == 1  # parked for later delivery
            assert runs_json(gw)[rec.run_id]["announce_retry_count"] == 3
    retries = [r["delay_s"] for r in logs if r["event"] == "subagent_announce_retry"]
    assert retries == [1.0, 2.0, 4.0]
    assert any(r["event"] == "subagent_announce_failed" and r["log_level"] == "error"
               for r in logs)


async def test_hard_expiry_after_30_minutes_kills_the_run(tmp_path, fake):
    fake.script.parent["research tides"] = [spawn_call(), "Started."]
    fake.script.child = {"type": "hang"}
    clock = FakeClock(T0)
    async with gateway_on(sub_config(tmp_path, fake), clock) as gw:
        await user_says(gw, "research tides")
        await until(lambda: any("Subagent run: " in r.json["messages"][0]["content"]
                                for r in fake.requests), what="the child's model call")
        rec = only_run(gw)
        await clock.advance(1790)
        await asyncio.sleep(0.05)
        assert rec.active  # 29m50s: still running
        await clock.advance(25)
        await until(lambda: rec.status == "timeout", what="the hard expiry")
        assert rec.outcome["error"] == "hard expiry: running for 30 minutes"
        await until(lambda: len(gw.testchan.texts()) == 2, what="the announce of the timeout")
        assert "finished with status timeout" in gw.testchan.texts()[1]


async def test_announce_expires_after_5_minutes(tmp_path, fake):
    fake.script.parent["research tides"] = [spawn_call(), "Started."]
    fake.script.parent["long job"] = [{"type": "hang"}]
    fake.script.child = {"type": "text", "text": "done", "delay": 0.3}
    clock = FakeClock(T0)
    async with gateway_on(sub_config(tmp_path, fake), clock) as gw:
        await user_says(gw, "research tides")
        await until(lambda: gw.testchan.texts())
        await user_says(gw, "long job")  # keeps the requester's lane busy
        rec = only_run(gw)
        await until(lambda: not rec.active, what="the child's end")
        await clock.advance(290)
        await asyncio.sleep(0.05)
        assert rec.announce_state == "pending"
        await clock.advance(25)
        await until(lambda: rec.announce_state == "expired")
        assert runs_json(gw)[rec.run_id]["announce_state"] == "expired"
        # never silently lost: the outcome goes to the user through the outbox
        await until(lambda: len(gw.testchan.texts()) == 2, what="the outbox delivery")
        assert gw.testchan.texts()[1] == (f'Subagent run {rec.run_id} finished with status '
                                          f'ok. Result: "done"')


async def test_orphan_after_new_is_marked_error_and_cleaned_up(tmp_path, fake):
    fake.script.parent["research tides"] = [spawn_call(cleanup="delete"), "Started."]
    fake.script.child = {"type": "hang"}
    clock = FakeClock(T0)
    async with gateway_on(sub_config(tmp_path, fake), clock) as gw:
        await user_says(gw, "research tides")
        await until(lambda: any("Subagent run: " in r.json["messages"][0]["content"]
                                for r in fake.requests))
        rec = only_run(gw)
        await until(lambda: gw.agents["main"].store.get(rec.child_session_key))
        await user_says(gw, "/new")
        await until(lambda: "Started a new session." in gw.testchan.texts())
        await clock.advance(16)  # the sweeper
        await until(lambda: rec.status == "error", what="the orphan")
        assert rec.outcome["error"] == "orphaned: the requester session ended"
        assert rec.announce_state == "skipped"
        await until(lambda: gw.agents["main"].store.get(rec.child_session_key) is None)
        assert len(gw.testchan.texts()) == 2  # nothing announced into the new session


async def test_restart_with_a_subagent_in_flight_marks_it_interrupted_and_announces(
        tmp_path, fake):
    fake.script.parent["research tides"] = [spawn_call(), "Started."]
    fake.script.child = {"type": "hang"}
    cfg = sub_config(tmp_path, fake)
    clock = FakeClock(T0)
    async with gateway_on(cfg, clock) as gw:
        await user_says(gw, "research tides")
        await until(lambda: any("Subagent run: " in r.json["messages"][0]["content"]
                                for r in fake.requests))
        run_id = only_run(gw).run_id
    on_disk = runs_json(gw)[run_id]
    assert on_disk["started_at"] and on_disk["ended_at"] is None  # in flight at stop
    fake.script.announce = lambda events: "The helper was interrupted by a restart."
    async with gateway_on(cfg, clock) as gw2:
        rec = gw2.subagents.service.get(run_id)
        assert rec.status == "interrupted"
        await until(lambda: rec.announce_state == "announced", what="the announce")
        assert gw2.testchan.texts() == ["The helper was interrupted by a restart."]
        assert runs_json(gw2)[run_id]["outcome"]["status"] == "interrupted"


async def test_corrupt_runs_file_disables_only_subagents(tmp_path, fake):
    fake.script.parent["research tides"] = [spawn_call(), "Could not start it."]
    cfg = sub_config(tmp_path, fake)
    path = tmp_path / "state" / "subagents" / "runs.json"
    path.parent.mkdir(parents=True)
    path.write_text("{torn")
    with capture_logs() as logs:
        async with gateway_on(cfg, FakeClock(T0)) as gw:
            await user_says(gw, "research tides")
            await until(lambda: gw.testchan.texts())
            tool = next(m for m in fake.requests[-1].json["messages"] if m["role"] == "tool")
            assert "subagents are disabled" in tool["content"] and str(path) in tool["content"]
            assert gw.status()["subagents"]["disabled"]
            assert any(p.startswith(f"subagents: {path} is unusable")
                       for p in gw.status()["problems"])
            await user_says(gw, "hello")
            await until(lambda: "echo: hello" in gw.testchan.texts())
    [err] = [r for r in logs if r["event"] == "state_file_corrupt"
             and r["owner"] == "subagents"]
    assert err["log_level"] == "error" and err["path"] == str(path)
    assert path.read_text() == "{torn"  # left for the operator


async def test_depth_and_count_limits(tmp_path, fake):
    three = {"type": "tool_calls", "calls": [
        {"name": "sessions_spawn", "arguments": {"task": f"part {i}"}} for i in range(3)]}
    fake.script.parent["split it"] = [three, "Started two."]
    fake.script.child = lambda body: (
        {"type": "tool_calls", "calls": [{"name": "sessions_spawn",
                                          "arguments": {"task": "deeper"}}]}
        if body["messages"][-1]["role"] != "tool" else
        {"type": "text", "text": "child: " + body["messages"][-1]["content"][:80]})
    cfg = sub_config(tmp_path, fake, max_children=2, tools={"deny": []})
    async with gateway_on(cfg, FakeClock(T0)) as gw:
        await user_says(gw, "split it")
        await until(lambda: gw.testchan.texts(), what="the parent's reply")
        req = next(r for r in fake.requests if r.json["messages"][-1]["role"] == "tool"
                   and "split it" in json.dumps(r.json["messages"]))
        results = [m["content"] for m in req.json["messages"] if m["role"] == "tool"]
        assert '"status": "accepted"' in results[0] and '"status": "accepted"' in results[1]
        assert "max_children 2" in results[2]
        await until(lambda: all(r.announce_state == "announced"
                                for r in gw.subagents.service.records.values()))
        for rec in gw.subagents.service.records.values():
            assert "subagent depth limit reached (max_depth 1)" in rec.outcome["text"]
        assert len(gw.subagents.service.records) == 2


async def test_cli_and_chat_command(tmp_path, fake, capsys):
    import yaml
    fake.script.parent["research tides"] = [spawn_call(label="tides"), "Started."]
    fake.script.child = {"type": "hang"}
    cfg = sub_config(tmp_path, fake)
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    clock = FakeClock(T0)
    async with gateway_on(cfg, clock) as gw:
        await user_says(gw, "research tides")
        await until(lambda: any("Subagent run: " in r.json["messages"][0]["content"]
                                for r in fake.requests))
        rec = only_run(gw)
        await until(lambda: gw.testchan.texts() == ["Started."], what="the parent's reply")
        await user_says(gw, "/subagents")
        await until(lambda: len(gw.testchan.texts()) == 2)
        assert gw.testchan.texts()[1].startswith(f"{rec.run_id} tides: running")
        code = await asyncio.to_thread(cli_main, ["--config", str(cfg_path), "subagents",
                                                  "list", "--json"])
        listed = _last_json(capsys)
        assert code == 0 and listed[0]["run_id"] == rec.run_id
        code = await asyncio.to_thread(cli_main, ["--config", str(cfg_path), "subagents",
                                                  "kill", rec.run_id, "--json"])
        assert code == 0
        await until(lambda: rec.status == "killed", what="the kill")
        await until(lambda: rec.announce_state == "announced")
        code = await asyncio.to_thread(cli_main, ["--config", str(cfg_path), "subagents",
                                                  "show", rec.run_id, "--json"])
        assert code == 0 and _last_json(capsys)["outcome"]["status"] == "killed"
        # a run that has ended cannot be killed: a clear error and a non-zero exit
        assert await asyncio.to_thread(cli_main, ["--config", str(cfg_path), "subagents",
                                                  "kill", rec.run_id]) == 1
        err = capsys.readouterr().err
        assert f"run {rec.run_id} already ended (outcome killed); nothing to kill" in err
        await user_says(gw, f"/subagents kill {rec.run_id}")
        await until(lambda: gw.testchan.texts()[-1] ==
                    f"Subagent run {rec.run_id} already ended (killed).")
        assert await asyncio.to_thread(cli_main, ["--config", str(cfg_path), "subagents",
                                                  "show", "nope"]) == 1


def _last_json(capsys) -> Any:
    """The JSON document at the end of stdout (the gateway's log lines come before)."""
    out = capsys.readouterr().out
    starts = [0] + [i + 1 for i, c in enumerate(out) if c == "\n"]
    for i in starts:
        if out[i:i + 1] in ("{", "["):
            try:
                return json.loads(out[i:])
            except ValueError:
                continue
    raise AssertionError(f"no JSON in {out!r}")


async def test_an_announce_given_up_for_a_local_session_waits_as_a_system_event(tmp_path,
                                                                                fake):
    """A CLI/webchat/API requester has no platform route for the outbox: when every
    announce turn failed (each one drained the system event), the outcome was gone; now
    it stays a system event of that session and its next turn carries it."""
    fake.script.parent["research tides"] = [spawn_call(), "Started."]
    fake.script.announce = lambda events: {"type": "error", "status": 400,
                                           "message": "model unavailable"}
    clock = FakeClock(T0)
    with capture_logs() as logs:
        async with gateway_on(sub_config(tmp_path, fake), clock) as gw:
            first = await gw.local.send("research tides")
            rec = only_run(gw)
            for n, delay in enumerate((1, 2, 4), start=1):
                await until(lambda n=n: sum(r["event"] == "subagent_announce_retry"
                                            for r in logs) == n, what=f"retry {n}")
                await clock.advance(delay)
            await until(lambda: rec.announce_state == "failed", what="given up")
            events = gw.scheduling.events.peek(first.session_key)
            assert [e.source for e in events] == ["subagent"]
            assert f"Subagent run {rec.run_id} finished with status ok" in events[0].text
            fake.script.announce = lambda events: "unused"
            fake.script.parent["anything new?"] = ["Your helper found the tide table."]
            await gw.local.send("anything new?")
            assert f"Subagent run {rec.run_id} finished" in \
                fake.requests[-1].json["messages"][0]["content"]
    parked = [r for r in logs if r["event"] == "subagent_announce_parked"]
    assert [p["parked_in"] for p in parked] == ["system_event"]
