"""Exec approvals with Discord message components (docs/exec.md): the real gateway
in-process, the real DiscordChannel (discord.py) against the fake Discord's buttons and
component interactions, and the fake model issuing exec tool calls."""

from __future__ import annotations

import asyncio
import json

import pytest
from structlog.testing import capture_logs

from tests.channel_harness import until
from tests.helpers import base_config, running_gateway

pytestmark = pytest.mark.timeout(30)

KEY = "agent:main:cli:dm:local"
COMMAND = "sh -c 'echo d >> d.txt'"


def config(tmp_path, model, dc) -> dict:
    section = {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
               "gateway_url": dc.gateway_url, "dm_policy": "open", "streaming": "off"}
    cfg = base_config(tmp_path / "state", model.base_url, channels={"discord": section})
    cfg["agents"]["defaults"]["tools"] = {"exec": {
        "security": "allowlist", "ask": "on-miss", "approvers": [f"discord:{dc.alice.id}"],
        "approval_timeout": "60s"}}
    return cfg


async def test_discord_buttons_always_allow_by_the_approver_only(tmp_path, model, dc):
    async with running_gateway(config(tmp_path, model, dc)) as gw:
        await until(lambda: gw.status()["channels"]["discord"]["state"] == "connected",
                    what="discord connected")
        ws = gw.config.workspace_for("main")
        model.script_tool_call("exec", {"command": COMMAND}, call_id="x1")
        model.script_text("first")
        turn = asyncio.create_task(gw.local.send("go", session_key=KEY))
        dm = dc.dm_channel_for(dc.alice)
        [prompt] = await until(lambda: [m for m in dc.messages.values()
                                        if m["channel_id"] == dm and m.get("components")],
                               what="the Discord prompt")
        buttons = {b["label"]: b["custom_id"] for b in dc.buttons(prompt["id"])}
        assert list(buttons) == ["Allow once", "Always allow", "Deny"]
        assert COMMAND in prompt["content"]
        # bob is no approver: an ephemeral answer (type 4, flag 64), nothing decided
        with capture_logs() as logs:
            stranger = await dc.press_button(prompt["id"], buttons["Always allow"],
                                             user=dc.bob)
            await until(lambda: stranger.callback, what="bob's answer")
        assert [r["by"] for r in logs if r["event"] == "approval_press_refused"] == [
            f"discord:{dc.bob.id}"]
        assert stranger.ephemeral and stranger.responses == [
            "Only an approver can answer this request."]
        assert not turn.done() and not (ws / "d.txt").exists()
        owner = await dc.press_button(prompt["id"], buttons["Always allow"], user=dc.alice)
        assert (await turn).text == "first"
        assert owner.ephemeral and owner.responses == ["Always allowed."]
        assert (ws / "d.txt").read_text() == "d\n"
        assert dc.buttons(prompt["id"]) == []
        assert f"Always allowed by discord:{dc.alice.id}" in dc.messages[prompt["id"]]["content"]
        # the stored pattern: the same command runs without a second prompt
        model.script_tool_call("exec", {"command": COMMAND}, call_id="x2")
        model.script_text("second")
        assert (await gw.local.send("again", session_key=KEY)).text == "second"
        assert (ws / "d.txt").read_text() == "d\nd\n"
        assert len([m for m in dc.messages.values() if m.get("components") is not None]) == 1
    stored = json.loads((tmp_path / "state/approvals.json").read_text())
    assert stored["always"]["main"][0]["by"] == f"discord:{dc.alice.id}"
