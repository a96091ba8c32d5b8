"""Exec approvals on replicas with Slack and Discord buttons (docs/exec.md "On
replicas"): two gateway replicas in-process on a real PostgreSQL, the real SlackChannel
(slack-bolt) against the fake Slack and the real DiscordChannel (discord.py) against the
fake Discord, the fake model. The session's lane — and so the paused turn — runs on
replica B; the approver's press arrives at replica A (A holds the Slack Socket Mode or
Discord gateway connection, or, in Slack's HTTP mode, the load balancer sends the
interactive payload to A). The press decides on A and the command runs on B, exactly
once; a second press is told it was decided already; a stranger's is refused."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from runtime.clock import FakeClock
from tests import cluster_harness
from tests.channel_harness import until
from tests.helpers import base_config
from tests.test_cluster_approvals import start, stop

replica_dbs = cluster_harness.replica_dbs  # fixture

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

OWNER, STRANGER = "U0OWNER", "U0BOB"
COMMAND = "sh -c 'echo once >> n.txt'"
KEY = "agent:main:cli:dm:ops"


def config(tmp: Path, name: str, dsn: str, model: Any, channel: str, section: dict,
           approver: str) -> dict:
    cfg = base_config(tmp / name / "state", model.base_url, channels={channel: section},
                      storage={"backend": "postgres", "dsn": dsn},
                      cluster={"lease_ttl": "3s", "replica_id": name})
    cfg["gateway"]["shutdown_grace"] = "0.5s"
    cfg["cron"] = {"enabled": False}
    cfg["agents"]["defaults"]["tools"] = {"exec": {
        "security": "allowlist", "ask": "on-miss", "allowlist": ["echo *"],
        "approvers": [approver], "approval_timeout": "60s"}}
    return cfg


async def replicas(tmp: Path, cfgs: tuple[dict, dict], account_on_a: bool):
    """A, then B; with ``account_on_a`` A runs the account (a connection) and B not."""
    clock = FakeClock(start=time.time())
    a = await start(cfgs[0], clock)
    if account_on_a:
        await until(lambda: a.cluster.accounts.running, what="A runs the account")
    b = await start(cfgs[1], clock)
    if account_on_a:
        assert not b.cluster.accounts.running  # the account stays on A
    return clock, a, b


def ran(*gws) -> list[str]:
    """The contents of n.txt in each replica's workspace that has one."""
    return [(w / "n.txt").read_text() for w in (g.config.workspace_for("main") for g in gws)
            if (w / "n.txt").exists()]


def slack_posts(slack) -> list[dict]:
    return [s for s in slack.sent if s["method"] == "chat.postMessage"
            and s["payload"].get("blocks")]


@pytest.mark.parametrize("mode", ["socket", "http"])
async def test_a_slack_press_on_another_replica_runs_the_command_once_on_the_lane_replica(
        tmp_path, pg_dsn, model, slack, mode):
    section = {"enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
               "api_base_url": slack.api_url.rstrip("/"), "dm_policy": "open",
               "streaming": "off", "mode": mode}
    if mode == "http":
        section["signing_secret"] = slack.signing_secret
    cfgs = tuple(config(tmp_path, n, pg_dsn, model, "slack", section, f"slack:{OWNER}")
                 for n in ("a", "b"))
    clock, a, b = await replicas(tmp_path, cfgs, account_on_a=mode == "socket")
    try:
        if mode == "http":  # the load balancer sends this Slack request to A
            slack.http_target = f"http://127.0.0.1:{a.port}/slack/events"
        model.script_tool_call("exec", {"command": COMMAND}, call_id="s1")
        model.script_text("ran it")
        turn = asyncio.create_task(b.local.send("go", session_key=KEY))
        [post] = await until(lambda: slack_posts(slack), what="the Slack prompt")
        channel, ts = post["channel"], post["ts"]
        buttons = {x["text"]["text"]: x["action_id"] for x in slack.buttons(channel, ts)}
        assert list(buttons) == ["Allow once", "Always allow", "Deny"]
        assert b.approvals.waiting() and not a.approvals.waiting()  # B's turn waits

        stranger = await slack.press_button(channel, ts, buttons["Allow once"], user=STRANGER)
        reply = slack.responses.of(stranger["response_url"])
        await until(lambda: reply.posts, what="the stranger's ephemeral answer")
        assert reply.ephemeral_texts == ["Only an approver can answer this request."]
        assert not turn.done() and ran(a, b) == []

        press = await slack.press_button(channel, ts, buttons["Allow once"], user=OWNER)
        presses = [press]
        if mode == "http":  # a double click: its second request reaches B
            slack.http_target = f"http://127.0.0.1:{b.port}/slack/events"
            presses.append(await slack.press_button(channel, ts, buttons["Allow once"],
                                                    user=OWNER))
        assert (await asyncio.wait_for(turn, 15)).text == "ran it"
        replies = [slack.responses.of(p["response_url"]) for p in presses]
        await until(lambda: all(r.posts for r in replies), what="the approver's answers")
        assert sorted(t for r in replies for t in r.ephemeral_texts) == [
            "Allowed once.", "Not changed: already allowed by slack:U0OWNER."][:len(presses)]
        assert ran(b) == ["once\n"] and ran(a) == []  # on the lane's replica, once
        await until(lambda: slack.buttons(channel, ts) == [], what="the buttons replaced")
        assert "Allowed once by slack:U0OWNER" in slack.shown(channel, ts)["text"]

        # a request B lets expire: B replaces the buttons of the prompt A's account sent
        model.script_tool_call("exec", {"command": "touch late.txt"}, call_id="s2")
        model.script_text("gave up")
        turn = asyncio.create_task(b.local.send("again", session_key=KEY))
        _, post = await until(lambda: slack_posts(slack)[1:] and
                              [None, *slack_posts(slack)[1:]], what="the second prompt")
        assert slack.buttons(post["channel"], post["ts"])
        await clock.advance(61)
        assert (await asyncio.wait_for(turn, 15)).text == "gave up"
        await until(lambda: slack.buttons(post["channel"], post["ts"]) == [],
                    what="the expired prompt's buttons replaced")
        assert "Expired" in slack.shown(post["channel"], post["ts"])["text"]
    finally:
        for gw in (b, a):
            await stop(gw, clock)
    assert ran(a, b) == ["once\n"]


async def test_a_discord_press_on_another_replica_runs_the_command_once_on_the_lane_replica(
        tmp_path, pg_dsn, model, dc):
    section = {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
               "gateway_url": dc.gateway_url, "dm_policy": "open", "streaming": "off"}
    cfgs = tuple(config(tmp_path, n, pg_dsn, model, "discord", section,
                        f"discord:{dc.alice.id}") for n in ("a", "b"))
    clock, a, b = await replicas(tmp_path, cfgs, account_on_a=True)
    try:
        await until(lambda: a.status()["channels"]["discord"]["state"] == "connected",
                    what="discord connected on A")
        model.script_tool_call("exec", {"command": COMMAND}, call_id="d1")
        model.script_text("ran it")
        turn = asyncio.create_task(b.local.send("go", session_key=KEY))
        dm = dc.dm_channel_for(dc.alice)
        [prompt] = await until(lambda: [m for m in dc.messages.values()
                                        if m["channel_id"] == dm and m.get("components")],
                               what="the Discord prompt")
        buttons = {x["label"]: x["custom_id"] for x in dc.buttons(prompt["id"])}
        assert list(buttons) == ["Allow once", "Always allow", "Deny"]
        assert COMMAND in prompt["content"]
        assert b.approvals.waiting() and not a.approvals.waiting()

        stranger = await dc.press_button(prompt["id"], buttons["Allow once"], user=dc.bob)
        await until(lambda: stranger.callback, what="bob's answer")
        assert stranger.ephemeral and stranger.responses == [
            "Only an approver can answer this request."]
        assert not turn.done() and ran(a, b) == []

        owner = await dc.press_button(prompt["id"], buttons["Allow once"], user=dc.alice)
        assert (await asyncio.wait_for(turn, 15)).text == "ran it"
        await until(lambda: owner.callback, what="alice's answer")
        assert owner.ephemeral and owner.responses == ["Allowed once."]
        assert ran(b) == ["once\n"] and ran(a) == []
        await until(lambda: dc.buttons(prompt["id"]) == [], what="the buttons replaced")
        assert f"Allowed once by discord:{dc.alice.id}" in dc.messages[prompt["id"]]["content"]

        # a request B lets expire: B replaces the buttons of the prompt A's account sent
        model.script_tool_call("exec", {"command": "touch late.txt"}, call_id="d2")
        model.script_text("gave up")
        turn = asyncio.create_task(b.local.send("again", session_key=KEY))
        [late] = await until(lambda: [m for m in dc.messages.values() if m["channel_id"] == dm
                                      and m.get("components") and m["id"] != prompt["id"]],
                             what="the second prompt")
        await clock.advance(61)
        assert (await asyncio.wait_for(turn, 15)).text == "gave up"
        await until(lambda: dc.buttons(late["id"]) == [],
                    what="the expired prompt's buttons replaced")
        assert "Expired" in dc.messages[late["id"]]["content"]
    finally:
        for gw in (b, a):
            await stop(gw, clock)
    assert ran(a, b) == ["once\n"]
