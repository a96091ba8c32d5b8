"""The history tail (issue 9 "per-turn cost flat over 1,000 turns"): the model sees at most
the newest ``agents.*.history_turns`` user turns of a session, the transcript on disk keeps
everything, and a turn never re-opens (re-reads) the transcript file once its session is
loaded. Proven through the real gateway against the fake OpenAI server: the request bodies
the model received, the transcript bytes on disk, and the interpreter's ``open`` audit
events."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from runtime.clock import FakeClock
from runtime.context.messages import assistant_message, tool_result_message, user_message
from runtime.context.session_log import SessionLog
from runtime.providers.base import ToolCall
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway

KEY = "agent:main:openai:dm:ann"


def user_texts(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def transcript_users(state: Path) -> list[str]:
    (path,) = (state / "agents" / "main" / "sessions").glob("*.jsonl")
    out = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        msg = entry.get("message") or {}
        if msg.get("role") == "user":
            out.append(msg["content"][0]["text"])
    return out


async def test_default_config_sends_the_newest_50_user_turns(tmp_path):
    async with FakeOpenAI() as fake:
        state = tmp_path / "state"
        async with running_gateway(base_config(state, fake.base_url)) as gw:
            assert gw.config.agents.defaults.history_turns == 50
            for i in range(56):
                await gw.local.send(f"message {i}", session_key=KEY, channel="openai")
        sent = user_texts(fake.requests[-1].json)
        assert sent == [f"message {i}" for i in range(6, 56)]
        # every assistant reply of the window went along with its user message
        roles = [m["role"] for m in fake.requests[-1].json["messages"]]
        assert roles == ["system"] + ["user", "assistant"] * 49 + ["user"]
        assert transcript_users(state) == [f"message {i}" for i in range(56)]


async def test_history_turns_setting_and_zero_for_everything(tmp_path):
    async with FakeOpenAI() as fake:
        cfg = base_config(tmp_path / "a", fake.base_url)
        cfg["agents"]["defaults"]["history_turns"] = 3
        async with running_gateway(cfg) as gw:
            for i in range(6):
                await gw.local.send(f"m{i}", session_key=KEY, channel="openai")
        assert user_texts(fake.requests[-1].json) == ["m3", "m4", "m5"]
    async with FakeOpenAI() as fake:
        cfg = base_config(tmp_path / "b", fake.base_url)
        cfg["agents"]["defaults"]["historyTurns"] = 0  # camelCase alias, 0 = unbounded
        async with running_gateway(cfg) as gw:
            for i in range(60):
                await gw.local.send(f"m{i}", session_key=KEY, channel="openai")
        assert user_texts(fake.requests[-1].json) == [f"m{i}" for i in range(60)]


async def test_a_turn_does_not_reopen_the_transcript(tmp_path):
    opened: list[str] = []

    def hook(event: str, args: tuple) -> None:
        if event == "open" and str(args[0]).endswith(".jsonl"):
            opened.append(str(args[0]))

    sys.addaudithook(hook)  # cannot be removed: it only records .jsonl opens
    async with FakeOpenAI() as fake:
        state = tmp_path / "state"
        async with running_gateway(base_config(state, fake.base_url)) as gw:
            await gw.local.send("first", session_key=KEY, channel="openai")
            sessions = str(state / "agents" / "main" / "sessions")
            first = [p for p in opened if p.startswith(sessions)]
            assert first, "the first turn opens its transcript"
            del opened[:]
            for i in range(30):
                await gw.local.send(f"again {i}", session_key=KEY, channel="openai")
            assert [p for p in opened if p.startswith(sessions)] == []
        assert len(transcript_users(state)) == 31


def test_window_keeps_the_compaction_summary_and_tool_pairs(tmp_path):
    log = SessionLog(tmp_path / "s.jsonl", session_id="s", session_key=KEY,
                     clock=FakeClock())
    for i in range(4):
        log.append_message(user_message(f"u{i}", 1000 + i))
        log.append_message(assistant_message(f"a{i}", [], 1000 + i))
    log.apply_compaction("the story so far", keep_from=4, tokens_before=100)
    call = ToolCall(id="c1", name="read", arguments={"path": "x"})
    for i in range(4, 7):
        log.append_message(user_message(f"u{i}", 2000 + i))
        log.append_message(assistant_message("", [call], 2000 + i))
        log.append_message(tool_result_message(call, "ok", False, 2000 + i))
        log.append_message(assistant_message(f"a{i}", [], 2000 + i))
    ctx = log.context(100_000, 2)
    assert ctx[0].content.endswith("the story so far")  # pinned in front of the cut
    assert [m.content for m in ctx[1:] if m.role == "user"] == ["u5", "u6"]
    assert [m.role for m in ctx[1:5]] == ["user", "assistant", "tool", "assistant"]
    full = log.context(100_000)
    assert [m.content for m in full if m.role == "user"][1:] == ["u2", "u3", "u4", "u5", "u6"]
    # a window wider than the session is the whole cached context
    assert log.context(100_000, 100) == full
    log.close()
