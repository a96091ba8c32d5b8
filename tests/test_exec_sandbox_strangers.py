"""Sandbox mode non-main with ``session.dm_scope: main`` (docs/exec.md "Sandbox"): every
DM lands in the main session, so a turn triggered by a sender who is not an owner is
sandboxed there too, and the approval prompt says where the command runs. The real
gateway in-process, the real TelegramChannel against the fake Bot API, bubblewrap."""

from __future__ import annotations

import shutil

import pytest

from tests.channel_harness import until
from tests.helpers import base_config, running_gateway
from tests.test_exec_approvals import APPROVER, STRANGER, USER, one_prompt, press, tool_results

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning"),
              pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap (bwrap) is not installed")]


def config(tmp_path, model, tg) -> dict:
    section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
               "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}
    cfg = base_config(tmp_path / "state", model.base_url, channels={"telegram": section},
                      session={"dm_scope": "main"})
    cfg["agents"]["defaults"].update({
        "owners": [f"telegram:{USER}"],
        "sandbox": {"mode": "non-main", "backend": "bwrap"},
        "tools": {"exec": {"security": "allowlist", "ask": "on-miss", "allowlist": ["ls *"],
                           "approvers": [f"telegram:{APPROVER}"],
                           "approval_timeout": "60s"}}})
    return cfg


async def test_a_strangers_command_is_sandboxed_in_the_main_session(tmp_path, model, tg):
    state = (tmp_path / "state").resolve()
    listing = f"ls -A {state}"  # the state dir is hidden in the sandbox
    async with running_gateway(config(tmp_path, model, tg)) as gw:
        model.script_tool_call("exec", {"command": listing}, call_id="stranger")
        model.script_text("done for the stranger")
        tg.inject_message("list it", chat_id=STRANGER, user_id=STRANGER)
        prompt = await one_prompt(tg)  # a stranger's message taints: it asks
        assert "Session: agent:main:main" in prompt["text"]
        assert "Where: runs in the sandbox" in prompt["text"]
        press(tg, prompt, "Allow once", APPROVER)
        await until(lambda: "stranger" in tool_results(model), what="the stranger's exec")
        assert "intake-journal.jsonl" not in tool_results(model)["stranger"]
        # the owner's turn in the same session runs on the host, unasked (allowlisted)
        await until(lambda: any(m.get("text") == "done for the stranger"
                                for m in tg.bot_messages(STRANGER)), what="the reply")
        model.script_tool_call("exec", {"command": listing}, call_id="owner")
        model.script_text("done for the owner")
        tg.inject_message("list it", chat_id=USER, user_id=USER)
        await until(lambda: "owner" in tool_results(model), what="the owner's exec")
        assert "intake-journal.jsonl" in tool_results(model)["owner"]
        assert len(gw.approvals.store.requests) == 1


def test_the_prompt_says_a_command_runs_on_the_host():
    from gateway.approvals.prompts import request_text
    from runtime.approvals.store import ApprovalRequest
    req = ApprovalRequest(id="ab12cd34", agent_id="main", session_key="agent:main:main",
                          session_id="s", tool="exec", command="ls", argv=["ls"],
                          binary="/usr/bin/ls", reason="not in the allowlist",
                          requested_at=0.0, expires_at=120.0, approvers=["telegram:1"],
                          runs="host")
    assert "Where: runs on the host" in request_text(req, 0.0)
