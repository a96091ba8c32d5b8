"""Sessions tools through the gateway against the fake model: sessions_list visibility,
sessions_history with shortened tool results, sessions_send (reply, ping-pong refused,
depth limit), session_status."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.clock import FakeClock
from tests.fakes.fake_openai import FakeOpenAI
from tests.scheduler_harness import T0, config, gateway

A = "agent:main:cli:dm:alice"
B = "agent:main:cli:dm:bob"
C = "agent:main:cli:dm:carol"


@pytest.fixture
async def fake():
    async with FakeOpenAI() as server:
        yield server


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_calls", "calls": [{"name": name, "arguments": args}]}


def tool_result(fake) -> Any:
    msg = fake.requests[-1].json["messages"][-1]
    assert msg["role"] == "tool"
    try:
        return json.loads(msg["content"])
    except ValueError:
        return msg["content"]


def two_agents(tmp_path, url, **tools) -> dict:
    cfg = config(tmp_path, url)
    cfg["agents"]["list"] = [{"id": "main"}, {"id": "work"}]
    if tools:
        cfg["tools"] = tools
    return cfg


async def test_sessions_list_is_limited_to_the_agent_unless_policy_allows(tmp_path, fake):
    for visibility, expected in (("agent", {A, B}), ("all", {A, B, "agent:work:cli:dm:w"})):
        fake.requests.clear()
        cfg = two_agents(tmp_path / visibility, fake.base_url,
                         sessions={"visibility": visibility})
        async with gateway(cfg, FakeClock(T0)) as gw:
            await gw.local.send("hi", to="bob")
            await gw.local.send("hi", to="w", agent_id="work")
            fake.push(call("sessions_list"), {"type": "text", "text": "listed"})
            await gw.local.send("who?", to="alice")
            rows = tool_result(fake)["sessions"]
            assert {r["key"] for r in rows} == expected
            assert next(r for r in rows if r["key"] == A)["current"] is True
            fake.push(call("sessions_history", key="agent:work:cli:dm:w"),
                      {"type": "text", "text": "ok"})
            await gw.local.send("peek", to="alice")
            result = tool_result(fake)
            if visibility == "agent":
                assert "belongs to agent 'work'" in result
            else:
                assert result["messages"][0] == {
                    "role": "user", "timestamp": result["messages"][0]["timestamp"],
                    "text": "hi"}


async def test_sessions_history_shortens_tool_results(tmp_path, fake):
    async with gateway(config(tmp_path, fake.base_url), FakeClock(T0)) as gw:
        fake.push(call("exec", command="seq 1 400"), {"type": "text", "text": "counted"})
        await gw.local.send("count", to="bob")
        fake.push(call("sessions_history", key=B, limit=3), {"type": "text", "text": "ok"})
        await gw.local.send("what did bob do?", to="alice")
        rows = tool_result(fake)["messages"]
        assert [r["role"] for r in rows] == ["assistant", "toolResult", "assistant"]
        assert rows[0]["tool_calls"] == ["exec"]
        assert rows[1]["tool"] == "exec" and rows[1]["text"].endswith(" chars]")
        assert len(rows[1]["text"]) < 230
        assert rows[2]["text"] == "counted"


async def test_sessions_send_runs_a_turn_there_and_refuses_ping_pong_and_depth(tmp_path,
                                                                             fake):
    def responder(body):
        last = body["messages"][-1]
        if last["role"] == "tool":
            return f"after tool: {last['content'][:120]}"
        text = last["content"]
        if text == "ask bob":
            return call("sessions_send", key=B, text="what is 2+2?")
        if "what is 2+2?" in text:
            return call("sessions_send", key=A, text="ping back")  # ping-pong attempt
        if text == "ask carol via bob":
            return call("sessions_send", key=B, text="forward to carol")
        if "forward to carol" in text:
            return call("sessions_send", key=C, text="hello carol")
        return None

    fake.responder = responder
    cfg = config(tmp_path, fake.base_url)
    cfg["tools"] = {"sessions": {"send_max_depth": 1}}
    async with gateway(cfg, FakeClock(T0)) as gw:
        for who in ("bob", "carol"):
            await gw.local.send("hi", to=who)
        result = await gw.local.send("ask bob", to="alice")
        # bob's turn tried to send back to alice (waiting for him): refused, so bob
        # answered; alice got bob's reply as the tool result
        assert "is waiting for your answer" in result.text
        assert result.text.startswith('after tool: {"key": "agent:main:cli:dm:bob", "reply":')
        result = await gw.local.send("ask carol via bob", to="alice")
        assert "sessions_send depth limit reached (1)" in result.text
        carol = gw.agents["main"].store.get(C)
        assert carol.counters.get("turns") == 1  # carol was never reached


async def test_session_status(tmp_path, fake):
    async with gateway(config(tmp_path, fake.base_url), FakeClock(T0)) as gw:
        fake.push(call("session_status"), {"type": "text", "text": "ok"})
        result = await gw.local.send("status?", to="alice")
        status = tool_result(fake)
        assert status["key"] == A and status["session_id"] == result.session_id
        assert status["model"] == "fake/fake-model" and status["subagent_runs"] == []
        assert status["created_at"].endswith("Z")


async def test_sessions_tools_reach_a_case_sensitive_key_as_listed(tmp_path, fake):
    """``...:openai:dm:CaseUser`` used to be lower-cased by sessions_history and
    sessions_send (no such session), and listed as ``%43ase%55ser``."""
    case_key = "agent:main:openai:dm:CaseUser"
    async with gateway(config(tmp_path, fake.base_url), FakeClock(T0)) as gw:
        fake.script_text("hello CaseUser")
        await gw.local.send("I am CaseUser", to="CaseUser", channel="openai")
        await gw.local.send("hi", to="caseuser", channel="openai")  # another person
        fake.push(call("sessions_list"), {"type": "text", "text": "listed"})
        await gw.local.send("who?", to="alice")
        keys = {r["key"] for r in tool_result(fake)["sessions"]}
        assert {case_key, "agent:main:openai:dm:caseuser"} <= keys
        fake.push(call("sessions_history", key=case_key), {"type": "text", "text": "read"})
        await gw.local.send("read it", to="alice")
        got = tool_result(fake)
        assert got["key"] == case_key
        assert [m["text"] for m in got["messages"]] == ["I am CaseUser", "hello CaseUser"]
        fake.push(call("sessions_send", key=case_key, text="ping"),
                  {"type": "text", "text": "pong from CaseUser"}, {"type": "text", "text": "ok"})
        await gw.local.send("send it", to="alice")
        assert tool_result(fake)["reply"] == "pong from CaseUser"
        fake.push(call("session_status", key=case_key), {"type": "text", "text": "ok"})
        await gw.local.send("status", to="alice")
        assert tool_result(fake)["key"] == case_key
