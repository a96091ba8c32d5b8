"""The sessions tools in a turn for a sender who is not an owner (docs/tools.md
"Sessions tools"): it lists and reads only its own conversation, never another person's
DM, and each refusal is logged; an owner's turn still sees every session of the agent.
The real gateway in-process, the real TelegramChannel against the fake Bot API."""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from tests.channel_harness import until
from tests.helpers import base_config, running_gateway
from tests.test_exec_approvals import tool_results

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

OWNER, ANN, CID = 4242, 101, 103
ANN_KEY = f"agent:main:telegram:dm:{ANN}"


def config(tmp_path, model, tg) -> dict:
    section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
               "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}
    cfg = base_config(tmp_path / "state", model.base_url, channels={"telegram": section})
    cfg["agents"]["defaults"]["owners"] = [f"telegram:{OWNER}"]
    return cfg


async def _ask(model, tg, user: int, call_id: str, tool: str, args: dict) -> str:
    model.script_tool_call(tool, args, call_id=call_id)
    model.script_text(f"{call_id} done")
    tg.inject_message(f"run {call_id}", chat_id=user, user_id=user)
    await until(lambda: call_id in tool_results(model), what=f"the {call_id} result")
    await until(lambda: any(m.get("text") == f"{call_id} done" for m in tg.bot_messages(user)),
                what=f"the {call_id} reply")
    return tool_results(model)[call_id]


async def test_a_stranger_sees_only_their_own_session_and_an_owner_sees_all(tmp_path, model,
                                                                            tg):
    async with running_gateway(config(tmp_path, model, tg)):
        model.script_text("noted")
        tg.inject_message("my secret: the blue door", chat_id=ANN, user_id=ANN)
        await until(lambda: tg.bot_messages(ANN), what="Ann's reply")
        with capture_logs() as logs:
            listed = json.loads(await _ask(model, tg, CID, "cid-list", "sessions_list", {}))
            read = await _ask(model, tg, CID, "cid-read", "sessions_history", {"key": ANN_KEY})
            status = await _ask(model, tg, CID, "cid-status", "session_status",
                                {"key": ANN_KEY})
        assert {r["key"] for r in listed["sessions"]} == {f"agent:main:telegram:dm:{CID}"}
        for refused in (read, status):
            assert "blue door" not in refused
            assert "reaches only its own session" in refused
        refusals = [e for e in logs if e["event"] == "sessions_tool_refused"]
        assert [e["target"] for e in refusals] == [ANN_KEY, ANN_KEY]
        assert all(e["stranger"] == f"telegram:{CID}" for e in refusals)
        # the owner's turn reaches every session of the agent
        owned = await _ask(model, tg, OWNER, "owner-read", "sessions_history", {"key": ANN_KEY})
        assert "blue door" in owned


async def test_a_strangers_subagent_is_held_to_the_same_rule(tmp_path, model, tg):
    def responder(body):
        last = body["messages"][-1]
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        if last["role"] == "tool":
            return "child done" if last.get("tool_call_id") == "child-read" else "spawned"
        if "peek at Ann" in text and body["messages"][0]["role"] == "system" \
                and "Subagent run" in body["messages"][0]["content"]:
            return {"type": "tool_calls", "calls": [{"id": "child-read",
                    "name": "sessions_history", "arguments": {"key": ANN_KEY}}]}
        if text.endswith("spawn it"):
            return {"type": "tool_calls", "calls": [{"id": "spawn", "name": "sessions_spawn",
                    "arguments": {"task": "peek at Ann"}}]}
        return "noted"

    model.responder = responder
    cfg = config(tmp_path, model, tg)
    cfg["tools"] = {"taint": {"mode": "off"}}  # the rule holds without taint: the spawn runs
    async with running_gateway(cfg):
        tg.inject_message("my secret: the blue door", chat_id=ANN, user_id=ANN)
        await until(lambda: tg.bot_messages(ANN), what="Ann's reply")
        with capture_logs() as logs:
            tg.inject_message("spawn it", chat_id=CID, user_id=CID)
            await until(lambda: "child-read" in tool_results(model), what="the child's read",
                        timeout=20)
        assert "blue door" not in tool_results(model)["child-read"]
        assert "reaches only its own session" in tool_results(model)["child-read"]
        assert any(e["event"] == "sessions_tool_refused" and e["target"] == ANN_KEY
                   for e in logs)
