"""Discord ``reply_in_thread`` (issue 13 "Reply modes and threading") through the whole
gateway: the real DiscordChannel (discord.py) against the fake Discord, whose threads
started from a message take that message's id, and the fake OpenAI model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from channels.outbound.render import render_chunks
from tests.channel_harness import chat_requests, last_user_text, sessions_with, until
from tests.fakes.fake_discord import FakeDiscord
from tests.fakes.fake_openai import FakeOpenAI, StreamGate
from tests.helpers import base_config, running_gateway

pytestmark = pytest.mark.timeout(40)
ANSWER = ("Here is the **tide table** for today: high water at 06:12 and 18:40, "
          "low water at 12:25. Bring boots if you go out at noon.")


def config(tmp_path: Path, model: FakeOpenAI, dc: FakeDiscord, **extra: Any) -> dict:
    section = {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
               "gateway_url": dc.gateway_url, "dm_policy": "open",
               "group_policy": "allowlist", "groups": [dc.channel_id], "streaming": "off",
               "reply_in_thread": True, "native_commands": False, **extra}
    return base_config(tmp_path / "state", model.base_url, channels={"discord": section})


def calls(dc: FakeDiscord, method: str, suffix: str) -> list[dict[str, Any]]:
    return [s for s in dc.sent if s["method"] == method and s["path"].endswith(suffix)]


async def test_mention_opens_a_thread_and_the_follow_up_stays_in_it(tmp_path, model, dc):
    async with running_gateway(config(tmp_path, model, dc)) as gw:
        await dc.send_guild("just chatting")  # unmentioned: context, no thread
        asked = await dc.send_guild("how high is the tide today?\nand tomorrow", mention=True)
        tid = asked["id"]
        [reply] = await until(lambda: dc.sent_messages(tid), what="the reply in the thread")
        [created] = calls(dc, "POST", f"/messages/{tid}/threads")
        assert created["path"] == f"/channels/{dc.channel_id}/messages/{tid}/threads"
        assert created["payload"]["name"] == "how high is the tide today?"
        assert dc.sent_messages(dc.channel_id) == []  # nothing in the channel itself
        assert "message_reference" not in reply["payload"]  # the thread hangs off it
        # the ack reaction sits on the message, which lives in the channel
        acks = calls(dc, "PUT", "/@me")
        assert acks and all(a["path"].startswith(
            f"/channels/{dc.channel_id}/messages/{tid}/reactions/") for a in acks)
        assert calls(dc, "POST", f"/channels/{dc.channel_id}/typing")  # before the thread

        await dc.send_guild("and the wind?", channel_id=tid, mention=True)
        await until(lambda: len(dc.sent_messages(tid)) == 2, what="the follow-up reply")
        assert len(calls(dc, "POST", "/threads")) == 1  # opened once
        key = f"agent:main:discord:group:{dc.channel_id}:thread:{tid}"
        await sessions_with(gw.state_dir, key)
        follow_up = chat_requests(model)[-1]
        assert "how high is the tide today?" in str(follow_up["messages"])  # same session
        assert last_user_text(follow_up).endswith("and the wind?")
        assert "just chatting" in str(chat_requests(model)[0]["messages"])  # group history


async def test_refused_thread_falls_back_to_the_channel(tmp_path, model, dc):
    dc.refuse_threads = True
    async with running_gateway(config(tmp_path, model, dc)):
        asked = await dc.send_guild("open a thread please", mention=True)
        [reply] = await until(lambda: dc.sent_messages(dc.channel_id),
                              what="the reply in the channel")
        assert str(reply["payload"]["message_reference"]["message_id"]) == asked["id"]
        assert calls(dc, "POST", f"/messages/{asked['id']}/threads")[0]["status"] == 403


async def test_streamed_reply_opens_the_thread_once(tmp_path, model, dc):
    gate = StreamGate()
    model.push({"type": "text", "text": ANSWER, "gate": gate})
    async with running_gateway(config(tmp_path, model, dc, streaming={
            "mode": "partial", "min_interval": "0.1s"})):
        tid = (await dc.send_guild("stream it", mention=True))["id"]
        gate.allow(1)
        await until(lambda: dc.chat_view(tid), what="the first streamed text")
        gate.open()
        final = render_chunks(ANSWER, "discord")[0].formatted
        await until(lambda: dc.chat_view(tid) == [final], what="the final text")
        assert len(calls(dc, "POST", "/threads")) == 1
        assert dc.edits(tid) and dc.sent_messages(dc.channel_id) == []


async def test_a_turn_resumed_after_a_restart_still_opens_its_thread(tmp_path, model, dc):
    """The gateway stops while the mention's turn runs (its thread not opened yet); the
    turn resumes at the next start, where the promise is forgotten: the reply still opens
    the thread and arrives in it, once (before: 404 Unknown Channel, the reply lost)."""
    model.script_text("still thinking", delay=5)
    model.script_text("The tide is high.")
    cfg = config(tmp_path, model, dc)
    cfg["gateway"]["shutdown_grace"] = "0.2s"
    async with running_gateway(cfg):
        asked = await dc.send_guild("how high is the tide today?", mention=True)
        await until(lambda: chat_requests(model), what="the first model call")
    tid = asked["id"]
    async with running_gateway(cfg):
        [reply] = await until(lambda: dc.sent_messages(tid), what="the resumed reply")
    assert reply["payload"]["content"] == "The tide is high."
    assert dc.sent_messages(dc.channel_id) == []
    assert [c["status"] for c in calls(dc, "POST", f"/messages/{tid}/threads")] == [201]
