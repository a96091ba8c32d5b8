"""Slack's native streaming (issue 13 "Streamed replies"): a partial reply in a thread goes
out through chat.startStream / appendStream / stopStream (the real slack-sdk client
against tests/fakes/fake_slack/), elsewhere — or with ``native_streaming: false`` — as
chat.postMessage + chat.update."""

from __future__ import annotations

import pytest

from runtime.clock import FakeClock
from tests.channel_harness import chat_requests, until
from tests.fakes.fake_openai import StreamGate
from tests.fakes.fake_slack import FakeSlack
from tests.helpers import base_config
from tests.test_streaming import ANSWER, gateway

pytestmark = [pytest.mark.timeout(60)]
CHANNEL = "C0GENERAL"


def slack_config(tmp_path, model, slack, **extra) -> dict:
    section = {"enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
               "api_base_url": slack.api_url, "dm_policy": "open",
               "group_policy": "allowlist", "groups": [CHANNEL], "streaming": "partial",
               **extra}
    return base_config(tmp_path / "state", model.base_url, channels={"slack": section})


def methods(slack: FakeSlack) -> list[str]:
    return [s["method"] for s in slack.sent]


async def stream_reply(slack: FakeSlack, model, clock: FakeClock, gate: StreamGate,
                       text: str) -> dict:
    """Mention the bot in the channel and let the reply stream piece by piece."""
    event = slack.message(slack.mention_text(text))
    await slack.push_event(event)
    await until(lambda: chat_requests(model), what="the model call")
    for _ in range(6):
        gate.allow(2)
        await until(lambda: "chat.startStream" in methods(slack), what="stream started")
        await clock.advance(1.0)
    gate.open()
    for _ in range(4):
        await clock.advance(1.0)
    return event


async def test_thread_reply_streams_natively_and_ends_as_the_full_text(tmp_path, model):
    clock, gate = FakeClock(), StreamGate()
    model.push({"type": "text", "text": ANSWER, "gate": gate})
    async with FakeSlack() as slack:
        async with gateway(slack_config(tmp_path, model, slack), clock, gate):
            await until(lambda: slack.connected_sockets, what="slack connected")
            event = await stream_reply(slack, model, clock, gate, "tides?")
            await until(lambda: slack.streamed(CHANNEL) and
                        not slack.streamed(CHANNEL)[0]["streaming"], what="stream stopped")
        [msg] = slack.streamed(CHANNEL)
        assert msg["text"] == ANSWER  # Slack renders the model's Markdown itself
        assert msg["thread_ts"] == event["ts"]  # reply_in_thread: in the mention's thread
        [start] = [s["payload"] for s in slack.sent if s["method"] == "chat.startStream"]
        assert start["recipient_user_id"] == "U0ALICE"
        assert start["recipient_team_id"] == slack.team_id
        sent = methods(slack)
        assert sent.count("chat.appendStream") >= 2 and sent.count("chat.stopStream") == 1
        assert "chat.postMessage" not in sent and "chat.update" not in sent
        assert slack.chat_view(CHANNEL) == [ANSWER]


async def test_native_streaming_off_posts_and_updates(tmp_path, model):
    clock, gate = FakeClock(), StreamGate()
    model.push({"type": "text", "text": ANSWER, "gate": gate})
    async with FakeSlack() as slack:
        cfg = slack_config(tmp_path, model, slack, native_streaming=False)
        async with gateway(cfg, clock, gate):
            await until(lambda: slack.connected_sockets, what="slack connected")
            event = slack.message(slack.mention_text("tides?"))
            await slack.push_event(event)
            await until(lambda: chat_requests(model), what="the model call")
            gate.allow(2)
            await until(lambda: slack.messages(CHANNEL), what="first post")
            gate.open()
            for _ in range(5):
                await clock.advance(1.0)
            await until(lambda: len(slack.updates(CHANNEL)) >= 1, what="the edit")
        assert "chat.startStream" not in methods(slack)
        [post] = slack.messages(CHANNEL)
        assert post["thread_ts"] == event["ts"]


async def test_fake_refuses_what_slack_refuses(model):
    """The fake follows the documented rules the sender relies on."""
    async with FakeSlack() as slack:
        from slack_sdk.errors import SlackApiError
        from slack_sdk.web.async_client import AsyncWebClient
        web = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
        with pytest.raises(SlackApiError, match="invalid_arguments"):
            await web.chat_startStream(channel=CHANNEL, thread_ts="1.1")  # no recipient
        resp = await web.chat_startStream(channel=CHANNEL, thread_ts="1.1",
                                          recipient_user_id="U0ALICE",
                                          recipient_team_id=slack.team_id,
                                          markdown_text="Hel")
        await web.chat_appendStream(channel=CHANNEL, ts=resp["ts"], markdown_text="lo")
        with pytest.raises(SlackApiError, match="invalid_arguments"):
            await web.chat_appendStream(channel=CHANNEL, ts=resp["ts"], markdown_text="")
        await web.chat_stopStream(channel=CHANNEL, ts=resp["ts"], markdown_text="!")
        with pytest.raises(SlackApiError, match="message_not_in_streaming_state"):
            await web.chat_appendStream(channel=CHANNEL, ts=resp["ts"], markdown_text="x")
        assert slack.streamed(CHANNEL)[0]["text"] == "Hello!"
