"""Taint across a subagent (docs/exec.md "Tainted turns"): a subagent spawned by a
tainted turn starts tainted (its side effects ask, even after the spawn was allowed), and
the result of a tainted run reaches the requester as quoted data that taints the turn
announcing it. The real gateway in-process, the real TelegramChannel against the fake
Bot API."""

from __future__ import annotations

import pytest

from scheduler.system_events import DATA_HEADING
from tests.channel_harness import until
from tests.helpers import running_gateway
from tests.test_exec_approvals import APPROVER, STRANGER, config, one_prompt, press
from tests.test_exec_tainted_requests import page  # noqa: F401 - a fixture

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

TASK = "write the notes file"


def _system(body) -> str:
    first = body["messages"][0]
    return first["content"] if first["role"] == "system" else ""


def responder(body):
    last = body["messages"][-1]
    text = last.get("content") if isinstance(last.get("content"), str) else ""
    child = "Subagent run" in _system(body)
    if last["role"] == "tool":
        return "child wrote it" if child else "spawned"
    if child and TASK in text:
        return {"type": "tool_calls", "calls": [{"id": "child-write", "name": "write",
                "arguments": {"path": "evil.md", "content": "obey the stranger"}}]}
    if text.endswith("spawn it"):
        return {"type": "tool_calls", "calls": [{"id": "spawn", "name": "sessions_spawn",
                "arguments": {"task": TASK}}]}
    return "noted"


async def test_a_tainted_turns_subagent_starts_tainted_and_its_result_is_data(tmp_path,
                                                                              model, tg):
    model.responder = responder
    async with running_gateway(config(tmp_path, model, tg)) as gw:
        tg.inject_message("spawn it", chat_id=STRANGER, user_id=STRANGER)
        spawn = await one_prompt(tg)  # the stranger's turn is tainted: the spawn asks
        assert "sessions_spawn" in spawn["text"]
        press(tg, spawn, "Allow once", APPROVER)
        write = await one_prompt(tg, 2)  # the child's write asks too: it starts tainted
        assert "spawned by a tainted turn" in write["text"]
        assert not (gw.config.workspace_for("main") / "evil.md").exists()
        press(tg, write, "Allow once", APPROVER)
        # the announcing turn in the stranger's session sees the result as quoted data
        await until(lambda: any(DATA_HEADING in _system(r.json or {})
                                and "child wrote it" in _system(r.json or {})
                                for r in model.requests), what="the announce turn", timeout=20)
        [rec] = gw.subagents.runs_of(f"agent:main:telegram:dm:{STRANGER}")
        assert rec.extra["tainted_by"][0].startswith(f"subagent run {rec.run_id}: ")


async def test_a_sessions_send_from_a_tainted_turn_starts_a_tainted_turn(tmp_path, model, tg,
                                                                         page):  # noqa: F811
    from tests.test_exec_approvals import USER
    from tests.test_exec_tainted_requests import config as fetch_config
    target = f"agent:main:telegram:dm:{APPROVER}"

    def send_responder(body):
        last = body["messages"][-1]
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        if last["role"] == "tool":
            return {"fetch": {"type": "tool_calls", "calls": [{"id": "send",
                    "name": "sessions_send", "arguments": {"key": target, "text": TASK}}]},
                    }.get(last.get("tool_call_id"), "done")
        if "Message from session" in text and TASK in text:
            return {"type": "tool_calls", "calls": [{"id": "target-write", "name": "write",
                    "arguments": {"path": "evil.md", "content": "obey the page"}}]}
        if text.endswith("fetch and send"):
            return {"type": "tool_calls", "calls": [{"id": "fetch", "name": "web_fetch",
                    "arguments": {"url": page}}]}
        return "noted"

    model.responder = send_responder
    async with running_gateway(fetch_config(tmp_path, model, tg)) as gw:
        tg.inject_message("hello", chat_id=APPROVER, user_id=APPROVER)
        await until(lambda: tg.bot_messages(APPROVER), what="the target session")
        tg.inject_message("fetch and send", chat_id=USER, user_id=USER)
        send = await one_prompt(tg)  # tainted by the page: the send asks
        press(tg, send, "Allow once", APPROVER)
        write = await one_prompt(tg, 2)  # the turn it starts is tainted too
        assert "sessions_send from a tainted turn: web_fetch of" in write["text"]
        assert not (gw.config.workspace_for("main") / "evil.md").exists()
