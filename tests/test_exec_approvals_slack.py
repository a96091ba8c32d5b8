"""Exec approvals with Slack Block Kit buttons (docs/exec.md): the real gateway
in-process, the real SlackChannel (slack-bolt + slack-sdk) against the fake Slack, in
Socket Mode and over HTTP (the press's signature checked), and the fake model issuing the
exec tool call."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlencode

import pytest
from structlog.testing import capture_logs

from tests.channel_harness import until
from tests.helpers import base_config, running_gateway

pytestmark = pytest.mark.timeout(30)

OWNER, STRANGER = "U0OWNER", "U0BOB"
KEY = "agent:main:cli:dm:local"


def config(tmp_path, model, slack, mode: str) -> dict:
    section = {"enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
               "api_base_url": slack.api_url.rstrip("/"), "dm_policy": "open",
               "streaming": "off", "mode": mode}
    if mode == "http":
        section["signing_secret"] = slack.signing_secret
    cfg = base_config(tmp_path / "state", model.base_url, channels={"slack": section})
    cfg["agents"]["defaults"]["tools"] = {"exec": {
        "security": "allowlist", "ask": "on-miss", "allowlist": ["echo *"],
        "approvers": [f"slack:{OWNER}"], "approval_timeout": "60s"}}
    return cfg


def prompt_posts(slack) -> list[dict]:
    return [s for s in slack.sent if s["method"] == "chat.postMessage"
            and s["payload"].get("blocks")]


@pytest.mark.parametrize("mode", ["socket", "http"])
async def test_slack_buttons_only_the_approver_decides(tmp_path, model, slack, mode):
    async with running_gateway(config(tmp_path, model, slack, mode)) as gw:
        if mode == "http":
            slack.http_target = f"http://127.0.0.1:{gw.port}/slack/events"
        ws = gw.config.workspace_for("main")
        model.script_tool_call("exec", {"command": "touch made.txt"}, call_id="s1")
        model.script_text("finished")
        turn = asyncio.create_task(gw.local.send("go", session_key=KEY))
        [post] = await until(lambda: prompt_posts(slack), what="the Slack prompt")
        channel, ts = post["channel"], post["ts"]
        assert channel == "D0OWNER"  # the approver's DM
        buttons = {b["text"]["text"]: b["action_id"] for b in slack.buttons(channel, ts)}
        assert list(buttons) == ["Allow once", "Always allow", "Deny"]
        assert "touch made.txt" in slack.shown(channel, ts)["text"]
        if mode == "http":  # a forged press (wrong signature) is refused before anything
            forged = urlencode({"payload": json.dumps({"type": "block_actions"})}).encode()
            status = await slack.post_signed(forged, secret="not-the-secret",
                                             content_type="application/x-www-form-urlencoded")
            assert status == 401
        # a stranger's press: an ephemeral answer only they see, nothing decided, logged
        with capture_logs() as logs:
            press = await slack.press_button(channel, ts, buttons["Allow once"],
                                             user=STRANGER)
            reply = slack.responses.of(press["response_url"])
            await until(lambda: reply.posts, what="the stranger's ephemeral answer")
        assert [r["by"] for r in logs if r["event"] == "approval_press_refused"] == [
            f"slack:{STRANGER}"]
        assert reply.ephemeral_texts == ["Only an approver can answer this request."]
        assert not turn.done() and not (ws / "made.txt").exists()
        # the approver denies it
        press = await slack.press_button(channel, ts, buttons["Deny"], user=OWNER)
        result = await turn
        assert result.text == "finished"
        reply = slack.responses.of(press["response_url"])
        await until(lambda: reply.posts, what="the approver's answer")
        assert reply.ephemeral_texts == ["Denied."]
    results = [m["content"] for r in model.requests for m in (r.json or {}).get("messages", [])
               if m["role"] == "tool"]
    assert results[-1] == "denied by slack:U0OWNER: the command did not run"
    assert not (ws / "made.txt").exists()
    shown = slack.shown(channel, ts)
    assert slack.buttons(channel, ts) == [] and "Denied by slack:U0OWNER" in shown["text"]
