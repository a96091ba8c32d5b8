"""Fast by default (issue 9), proven through the real gateway and the real openai SDK
against the fake OpenAI server: an idle session starts at once (fake clock, no advance),
per-channel idle debounce, non-streaming model calls unless someone consumes deltas,
``max_concurrent`` per provider without holding the lane cap, and one timeline
transaction for many turns (counted in the database file's header)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai

from channels.config import channel_debounce
from gateway.config.load import parse_config
from runtime.clock import FakeClock
from tests.channel_harness import until
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

USER = 4242


def default_queue(cfg: dict) -> dict:
    """``base_config`` minus its test-speed queue settings: the shipped defaults."""
    cfg.pop("messages", None)
    return cfg


async def test_idle_session_starts_at_once_on_the_default_config(tmp_path):
    clock = FakeClock()
    async with FakeOpenAI() as fake:
        cfg = default_queue(base_config(tmp_path / "state", fake.base_url))
        async with running_gateway(cfg, clock=clock) as gw:
            assert gw.config.messages.queue.mode == "collect"
            assert gw.config.messages.queue.debounce == 1.0  # still the busy-session rule
            t0 = clock.monotonic()
            fake.script_text("at once")
            # The fake clock never advances: a debounce wait would hang this call.
            result = await asyncio.wait_for(gw.local.send("hello"), 20)
            assert result.text == "at once"
            assert clock.monotonic() == t0


async def test_channel_debounce_merges_an_idle_burst_of_one_chat(tmp_path):
    """``channels.telegram.debounce: 2s``: two messages of one chat 1 s apart share one
    turn, started 2 s after the second (fake clock); the window is still open at 2.5 s."""
    clock = FakeClock()
    tg = await FakeTelegram().start()
    try:
        async with FakeOpenAI() as fake:
            section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                       "poll_timeout": 1, "dm_policy": "open", "debounce": "2s"}
            cfg = base_config(tmp_path / "state", fake.base_url,
                              channels={"telegram": section})
            async with running_gateway(cfg, clock=clock) as gw:
                assert channel_debounce(gw.config.channels, "telegram") == 2.0
                key, lanes = f"agent:main:telegram:dm:{USER}", gw.lanes._lanes
                fake.script_text("both seen")
                tg.inject_message("first", chat_id=USER, user_id=USER)
                await until(lambda: key in lanes and lanes[key].queue, what="first queued")
                await clock.advance(1.0)
                tg.inject_message("second", chat_id=USER, user_id=USER)
                await until(lambda: len(lanes[key].queue[0].items) == 2, what="one batch")
                await clock.advance(1.5)
                await asyncio.sleep(0.05)
                assert len(fake.requests) == 0  # the window is still open
                await clock.advance(1.0)
                for _ in range(100):  # the send paces itself on the gateway clock too
                    if tg.bot_messages(USER):
                        break
                    await clock.advance(0.5)
                    await asyncio.sleep(0.02)
                assert [m["text"] for m in tg.bot_messages(USER)] == ["both seen"]
                users = [m["content"] for m in fake.requests[-1].json["messages"]
                         if m["role"] == "user"]
                assert users[-2:] == ["first", "second"] and len(fake.requests) == 1
    finally:
        await tg.stop()


async def test_an_awaited_request_ignores_the_channel_debounce(tmp_path):
    """An OpenAI-compatible request waits for its own answer and never shares a turn, so
    ``channels.openai_api.debounce`` does not delay it (fake clock, never advanced)."""
    clock = FakeClock()
    async with FakeOpenAI() as fake:
        cfg = base_config(tmp_path / "state", fake.base_url,
                          channels={"openai_api": {"debounce": "2s"}})
        async with running_gateway(cfg, clock=clock) as gw:
            fake.script_text("at once")
            sub = gw.local.submit("first", session_key="agent:main:openai:dm:ann",
                                  channel="openai")
            assert (await asyncio.wait_for(sub.future, 20)).text == "at once"


def test_channel_debounce_config_per_platform_and_account():
    loaded = parse_config({"channels": {"telegram": {
        "enabled": True, "token": "1:x", "debounce": "1500ms",
        "accounts": {"alerts": {"token": "2:y", "debounce": 0}, "ops": {"token": "3:z"}}}}},
        "test", env={})
    ch = loaded.config.channels
    assert channel_debounce(ch, "telegram", "ops") == 1.5  # inherited from the section
    assert channel_debounce(ch, "telegram", "alerts") == 0.0
    assert channel_debounce(ch, "slack") == 0.0  # default: start at once
    assert channel_debounce(ch, "cli") == 0.0


async def test_model_is_called_streaming_only_when_deltas_are_consumed(tmp_path):
    async with FakeOpenAI() as fake:
        async with running_gateway(base_config(tmp_path / "state", fake.base_url)) as gw:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1",
                                        api_key=gw.token, max_retries=0)
            resp = await client.chat.completions.create(
                model="tidegate/main", user="ann", messages=[{"role": "user", "content": "hi"}])
            assert resp.choices[0].message.content == "echo: hi"
            plain = fake.requests[-1].json
            assert not plain.get("stream") and "stream_options" not in plain
            stream = await client.chat.completions.create(
                model="tidegate/main", user="ann", stream=True,
                messages=[{"role": "user", "content": "stream it please"}])
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            assert "".join(parts) == "echo: stream it please"
            assert fake.requests[-1].json["stream"] is True
            await gw.local.send("from the cli")  # nobody reads deltas
            assert not fake.requests[-1].json.get("stream")
            sub = gw.local.submit("from the webchat", channel="webchat", stream=True)
            await sub.future
            assert fake.requests[-1].json["stream"] is True


class CountingOpenAI(FakeOpenAI):
    """The fake, counting chat requests in flight per model."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.in_flight: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.finished: list[str] = []

    async def _chat(self, request):
        model = (await request.json()).get("model", "")
        self.in_flight[model] = self.in_flight.get(model, 0) + 1
        self.peak[model] = max(self.peak.get(model, 0), self.in_flight[model])
        try:
            return await super()._chat(request)
        finally:
            self.in_flight[model] -= 1
            self.finished.append(model)


async def test_provider_max_concurrent_without_holding_the_lane_cap(tmp_path):
    async with CountingOpenAI() as fake:
        fake.responder = lambda body: {"type": "text", "text": "ok", "delay": 0.4
                                       if body["model"] == "slow-model" else 0}
        cfg = base_config(tmp_path / "state", fake.base_url, lanes={"main": 2})
        provider = cfg["models"]["providers"]["fake"]
        cfg["models"]["providers"] = {"slow": {**provider, "max_concurrent": 1},
                                      "fast": provider}
        cfg["agents"] = {"list": [{"id": "main", "model": "fast/fast-model"},
                                  {"id": "slowpoke", "model": "slow/slow-model"}]}
        async with running_gateway(cfg) as gw:
            slow = [gw.local.submit("hi", agent_id="slowpoke", to=f"u{i}").future
                    for i in range(3)]
            while fake.in_flight.get("slow-model", 0) < 1:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # the other two are now waiting for the slot
            fast = gw.local.submit("hi", agent_id="main", to="v").future
            # Lane cap 2, three slowpoke turns: only the one in its model call holds a lane
            # slot, so the fast agent's turn runs now, not after the first slow call.
            await asyncio.wait_for(fast, 0.35)
            assert fake.finished == ["fast-model"]
            await asyncio.gather(*slow)
            assert fake.peak == {"slow-model": 1, "fast-model": 1}
            assert gw.providers.slots.limits == {"slow": 1}
            assert gw.lanes.stats()["running"]["main"] == 0


def commits(db: Path) -> int:
    """Write transactions committed to the timeline: the database header's file change
    counter (SQLite file format, offset 24; the timeline runs a rollback journal)."""
    return int.from_bytes(db.read_bytes()[24:28], "big")


def pending_lines(db: Path) -> int:
    """Batches in the timeline's pending log (one line per acknowledged write)."""
    path = db.with_name(db.name + "-pending")
    return len(path.read_bytes().splitlines()) if path.exists() else 0


async def test_one_timeline_write_per_turn_and_one_transaction_for_many(tmp_path):
    state = tmp_path / "state"
    db = state / "timeline.db"
    async with FakeOpenAI() as fake:
        async with running_gateway(base_config(state, fake.base_url)) as gw:
            await gw.local.send("first")  # creates the session (and its timeline)
            await gw.timeline_hooks.flush()
            before, lines = commits(db), pending_lines(db)
            for i in range(5):
                await gw.local.send(f"message {i}")
            await gw.timeline_hooks.flush()
            # USER_INPUT + LLM_RESPONSE of each turn: one pending-log line before the
            # reply, its OUTCOME one after it (durable at once); no transaction
            assert (commits(db), pending_lines(db) - lines) == (before, 10)
            fake.script_tool_call("read", {"path": "nothing.txt"})
            fake.script_text("done")
            await gw.local.send("use a tool")
            await gw.timeline_hooks.flush()
            # tool round: call on disk before the tool runs, then the rest at the end
            assert pending_lines(db) - lines == 13
            events = await gw.timeline_hooks.timeline.get_timeline(
                gw.agents["main"].store.get("agent:main:cli:dm:local").session_id)
            assert [e.event_type for e in events[-6:]] == [
                "USER_INPUT", "LLM_RESPONSE", "TOOL_CALL", "TOOL_RESULT", "LLM_RESPONSE",
                "OUTCOME"]
            # that read committed all of them in ONE transaction and emptied the log
            assert (commits(db) - before, pending_lines(db)) == (1, 0)


async def test_transcript_lines_of_a_turn_are_written_at_its_durability_points(tmp_path):
    state = tmp_path / "state"
    seen: list[list[str]] = []
    async with FakeOpenAI() as fake:
        async with running_gateway(base_config(state, fake.base_url)) as gw:
            await gw.local.send("first")
            entry = gw.agents["main"].store.get("agent:main:cli:dm:local")
            path = state / "agents" / "main" / "sessions" / f"{entry.session_id}.jsonl"
            before = path.stat().st_size
            script = iter([{"type": "text", "calls": [{"name": "read",
                                                       "arguments": {"path": "x.txt"}}]},
                           {"type": "text", "text": "all done"}])

            def responder(body):  # what is on disk while the model works
                seen.append(path.read_bytes()[before:].decode().splitlines())
                return next(script)
            fake.responder = responder
            await gw.local.send("use a tool")
            lines = path.read_bytes()[before:].decode().splitlines()
    roles = [json.loads(x)["message"]["role"] for x in lines]
    assert roles == ["user", "assistant", "toolResult", "assistant"]
    # 1st model call: the user's message is already on disk (never lost to a crash).
    assert len(seen[0]) == 1 and "use a tool" in seen[0][0]
    # 2nd call: the tool call went to disk before the tool ran; its result is held and
    # written with the answer in one write at the end of the turn.
    assert seen[1] == lines[:2]


def test_max_concurrent_is_validated_by_path():
    import pytest

    from gateway.config.load import ConfigError
    with pytest.raises(ConfigError, match=r"models\.providers\.p\.max_concurrent"):
        parse_config({"models": {"providers": {"p": {"api": "openai", "max_concurrent": 0}}}},
                     "test", env={})
    loaded = parse_config({"models": {"providers": {"p": {"api": "openai",
                                                          "maxConcurrent": 3}}}}, "test", env={})
    assert loaded.config.models.providers["p"].max_concurrent == 3
