"""Exec approvals in the chat (docs/exec.md): the real gateway in-process, the real
TelegramChannel (python-telegram-bot) against the fake Bot API's inline keyboards and
callback queries, and the fake model issuing exec tool calls. Each test asserts what the
approver's chat showed, what the model got back, and what reached disk."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from runtime.clock import FakeClock
from tests.channel_harness import log_events, until
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER, APPROVER, STRANGER = 4242, 1001, 666
DM_KEY = f"agent:main:telegram:dm:{USER}"


def config(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, **exec_rules: Any) -> dict:
    section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
               "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}
    cfg = base_config(tmp_path / "state", model.base_url, channels={"telegram": section})
    cfg["gateway"]["shutdown_grace"] = "0.5s"
    cfg["agents"]["defaults"]["tools"] = {"exec": {
        "security": "allowlist", "ask": "on-miss", "allowlist": ["echo *"],
        "approvers": [f"telegram:{APPROVER}"], "approval_timeout": "60s", **exec_rules}}
    return cfg


def prompts(tg: FakeTelegram, chat: int = APPROVER) -> list[dict[str, Any]]:
    """The approver's messages that were sent with an inline keyboard (as they are now)."""
    return [tg.messages[k] for k in tg.keyboard_messages if k[0] == chat]


def sent_keyboard(tg: FakeTelegram, prompt: dict[str, Any]) -> list[dict[str, Any]]:
    """The buttons ``prompt`` was sent with."""
    [payload] = [s["payload"] for s in tg.sent if s["method"].lower() == "sendmessage"
                 and s["status"] == 200 and s["payload"].get("reply_markup")
                 and s["payload"]["chat_id"] == prompt["chat"]["id"]
                 and s["payload"]["text"].startswith(prompt["text"].split("\n")[0][:12])]
    return [b for row in payload["reply_markup"]["inline_keyboard"] for b in row]


async def one_prompt(tg: FakeTelegram, n: int = 1) -> dict[str, Any]:
    found = await until(lambda: len(prompts(tg)) >= n and prompts(tg), what="approval prompt")
    return found[n - 1]


def press(tg: FakeTelegram, prompt: dict[str, Any], label: str, user: int) -> str:
    [data] = [b["callback_data"] for row in prompt["reply_markup"]["inline_keyboard"]
              for b in row if b["text"] == label]
    update = tg.press_button(APPROVER, prompt["message_id"], data, user_id=user)
    return update["callback_query"]["id"]


def tool_results(model: FakeOpenAI) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in model.requests:
        for m in (r.json or {}).get("messages", []):
            if m["role"] == "tool":
                out[m["tool_call_id"]] = m["content"]
    return out


def timeline_approvals(state: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(state / "timeline.db")
    try:
        rows = [json.loads(c) for (c,) in conn.execute(
            "SELECT content FROM timeline_events WHERE event_type = 'SYSTEM_EVENT' "
            "ORDER BY timestamp, seq")]
    finally:
        conn.close()
    return [r for r in rows if r.get("kind") == "exec_approval"]


async def test_allowlisted_runs_a_miss_asks_and_only_the_approvers_press_counts(
        tmp_path, model, tg):
    async with running_gateway(config(tmp_path, model, tg)) as gw:
        ws = gw.config.workspace_for("main")
        model.script_tool_call("exec", {"command": "echo allowlisted-ran"}, call_id="c1")
        model.script_tool_call("exec", {"command": "echo once >> count.txt"}, call_id="c2")
        model.script_text("all done")
        with capture_logs() as logs:
            tg.inject_message("please run things", chat_id=USER, user_id=USER)
            prompt = await one_prompt(tg)
            # the allowlisted command ran without a request; the miss asks, naming why
            assert "allowlisted-ran" in tool_results(model)["c1"]
            assert "echo once >> count.txt" in prompt["text"]
            assert "not one plain command" in prompt["text"]
            labels = [b["text"] for row in prompt["reply_markup"]["inline_keyboard"]
                      for b in row]
            assert labels == ["Allow once", "Deny"]  # not plain: nothing to store
            assert not (ws / "count.txt").exists()  # the turn waits
            # a stranger's press is refused, answered only to them, and logged
            qid = press(tg, prompt, "Allow once", STRANGER)
            await until(lambda: tg.callback_queries.get(qid), what="stranger answered")
            assert tg.callback_queries[qid]["text"] == \
                "Only an approver can answer this request."
            assert not (ws / "count.txt").exists()
            # the approver's press runs it, exactly once
            qid = press(tg, prompt, "Allow once", APPROVER)
            await until(lambda: tg.bot_messages(USER), what="the reply")
        assert tg.callback_queries[qid]["text"] == "Allowed once."
        assert [m["text"] for m in tg.bot_messages(USER)] == ["all done"]
        assert (ws / "count.txt").read_text() == "once\n"
        assert tool_results(model)["c2"].startswith("[exit code 0]")
        # the buttons are gone and the prompt says who decided
        assert tg.keyboard(APPROVER, prompt["message_id"]) == []
        assert "Allowed once by telegram:1001" in \
            tg.messages[(APPROVER, prompt["message_id"])]["text"]
        [refused] = log_events(logs, "approval_press_refused")
        assert refused["by"] == f"telegram:{STRANGER}"
        assert len(prompts(tg)) == 1
    events = timeline_approvals(tmp_path / "state")
    assert [(e["event"], e.get("by")) for e in events] == [
        ("requested", None), ("allowed", "telegram:1001")]
    assert events[0]["command"] == "echo once >> count.txt"


async def test_deny_timeout_and_always_allow_give_the_model_plain_results(tmp_path, model, tg):
    clock = FakeClock()
    key = "agent:main:cli:dm:local"
    command = "sh -c 'echo approved >> log.txt'"
    async with running_gateway(config(tmp_path, model, tg), clock=clock) as gw:
        ws = gw.config.workspace_for("main")

        async def turn(call_id: str, answer):
            model.script_tool_call("exec", {"command": command}, call_id=call_id)
            model.script_text(f"after {call_id}")
            task = asyncio.create_task(gw.local.send("go", session_key=key))
            n = len(tg.keyboard_messages) + 1
            prompt = await one_prompt(tg, n)
            await answer(prompt)
            result = await task
            assert result.text == f"after {call_id}"
            return prompt

        async def deny(prompt):
            press(tg, prompt, "Deny", APPROVER)

        async def wait_out(prompt):
            await clock.advance(61)

        async def always(prompt):
            press(tg, prompt, "Always allow", APPROVER)

        p1 = await turn("d1", deny)
        assert tool_results(model)["d1"] == "denied by telegram:1001: the command did not run"
        await turn("t1", wait_out)
        assert tool_results(model)["t1"] == \
            "timed out: nobody approved the command within 60s; it did not run"
        assert not (ws / "log.txt").exists()
        await turn("a1", always)
        assert (ws / "log.txt").read_text() == "approved\n"
        # stored: the same argv now runs without a request
        model.script_tool_call("exec", {"command": command}, call_id="a2")
        model.script_text("again")
        assert (await gw.local.send("go", session_key=key)).text == "again"
        assert (ws / "log.txt").read_text() == "approved\n" * 2
        assert len(tg.keyboard_messages) == 3
        assert "Denied by telegram:1001" in tg.messages[(APPROVER, p1["message_id"])]["text"]
    stored = json.loads((tmp_path / "state/approvals.json").read_text())
    [pattern] = stored["always"]["main"]
    assert pattern["by"] == "telegram:1001"
    assert pattern["pattern"].endswith("sh -c 'echo approved >> log.txt'")
    assert [r["status"] for r in sorted(stored["requests"], key=lambda r: r["requested_at"])
            ] == ["denied", "expired", "allowed"]
    events = [(e["event"], e.get("by")) for e in timeline_approvals(tmp_path / "state")]
    assert events == [("requested", None), ("denied", "telegram:1001"),
                      ("requested", None), ("expired", None),
                      ("requested", None), ("allowed", "telegram:1001")]
