"""The Slack adapter (channels/slack/adapter.py) with the real slack-bolt/slack-sdk against
the fake Slack in tests/fakes/fake_slack/ (Socket Mode WebSocket, Web API, signed HTTP
Events API). Time-dependent paths use a FakeClock; the reconnect tests use the real clock
with backoffs of tens of milliseconds."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web

from channels.base import ChannelEvent, InboundMessage, OutboundMessage
from channels.slack.adapter import SlackChannel
from channels.slack.config import SlackAccount
from runtime.clock import SYSTEM_CLOCK, FakeClock

try:
    from tests.fakes.fake_slack import FakeSlack, sign, start_in_thread
except ImportError:  # tests/ is not a package: pytest puts tests/ itself on sys.path
    from fakes.fake_slack import FakeSlack, sign, start_in_thread

pytestmark = pytest.mark.timeout(20)

LIMIT = 4000  # Slack's per-message guideline used by render_chunks("slack")


class Inbox:
    """Collects what the adapter hands to the gateway."""

    def __init__(self) -> None:
        self.messages: list[InboundMessage] = []
        self.events: list[ChannelEvent] = []

    async def on_message(self, msg: InboundMessage) -> None:
        self.messages.append(msg)

    async def on_event(self, ev: ChannelEvent) -> None:
        self.events.append(ev)

    async def wait(self, n: int = 1, *, events: bool = False, timeout: float = 5.0) -> None:
        items = self.events if events else self.messages
        deadline = time.monotonic() + timeout
        while len(items) < n:
            assert time.monotonic() < deadline, f"got {len(items)} of {n}: {items}"
            await asyncio.sleep(0.01)


async def wait_until(pred, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    f = await FakeSlack().start()
    yield f
    await f.stop()


def account(fake: FakeSlack, **kw: Any) -> SlackAccount:
    # No trailing slash on purpose: such a config must work (the adapter adds the slash;
    # slack-sdk 3.48 does too, older releases dropped the last path segment).
    # reply_in_thread (issue 13) off: these tests check the plain normalisation
    base = {"bot_token": fake.bot_token, "app_token": fake.app_token,
            "api_base_url": fake.url + "/api", "reply_in_thread": False}
    base.update(kw)
    return SlackAccount(**base)


@asynccontextmanager
async def running(fake: FakeSlack, clock: Any = None, **kw: Any
                  ) -> AsyncIterator[tuple[SlackChannel, Inbox]]:
    acc_kw = {k: kw.pop(k) for k in list(kw) if k in SlackAccount.model_fields}
    ch = SlackChannel("default", account(fake, **acc_kw), clock=clock or FakeClock(), **kw)
    inbox = Inbox()
    await ch.start(inbox.on_message, inbox.on_event)
    try:
        yield ch, inbox
    finally:
        await ch.stop()


def posts(fake: FakeSlack) -> list[dict[str, Any]]:
    """chat.postMessage requests as the bot made them (accepted or not)."""
    return [c for c in fake.calls if c["method"] == "chat.postMessage"]


# --------------------------------------------------------------------------- inbound


async def test_reply_in_thread_moves_top_level_channel_messages_into_their_thread(
        fake: FakeSlack) -> None:
    async with running(fake, reply_in_thread=True) as (_ch, inbox):
        await fake.push_event(fake.message("<@U0BOT> top level", channel="C0GENERAL",
                                           ts="1767225600.000200"))
        await fake.push_event(fake.message("<@U0BOT> in a thread", channel="C0GENERAL",
                                           thread_ts="1767225600.000200"))
        await fake.push_event(fake.dm("a DM", ts="1767225600.000300"))
        await inbox.wait(3)
        top, threaded, dm = inbox.messages
        assert (top.chat_type, top.group_id, top.thread_id) == (
            "thread", "C0GENERAL", "1767225600.000200")
        assert (threaded.chat_type, threaded.thread_id) == ("thread", "1767225600.000200")
        assert (dm.chat_type, dm.thread_id) == ("dm", None)


async def test_dm_becomes_inbound_message(fake: FakeSlack) -> None:
    clock = FakeClock()
    async with running(fake, clock) as (ch, inbox):
        assert ch.state == "connected"
        env = await fake.push_event(fake.dm("hello &amp; <https://example.com|docs>",
                                            ts="1767225600.000100"))
        await inbox.wait()
        msg = inbox.messages[0]
        assert (msg.channel, msg.account_id, msg.chat_type) == ("slack", "default", "dm")
        assert (msg.peer_id, msg.sender_id, msg.group_id, msg.thread_id) == (
            "U0ALICE", "U0ALICE", None, None)
        assert (msg.sender_name, msg.sender_username) == ("alice", "alice")
        assert msg.text == "hello & docs (https://example.com)"
        assert msg.message_id == "D0ALICE:1767225600.000100"
        assert msg.received_at == clock.time()
        assert not msg.is_bot and not msg.mentions_bot and msg.reply_to is None
        await wait_until(lambda: any(a["envelope_id"] == env["envelope_id"] for a in fake.acks))
        status = ch.status()
        assert status["state"] == "connected" and status["bot_id"] == "U0BOT"
        assert status["bot_username"] == "tidegate" and status["connected_since"].endswith("Z")
    assert [c["path"] for c in fake.calls[:2]] == ["/api/auth.test", "/api/apps.connections.open"]
    assert ch.state == "stopped"


async def test_group_messages_with_and_without_mention(fake: FakeSlack) -> None:
    async with running(fake) as (_ch, inbox):
        await fake.push_event(fake.message("just chatting", channel="C0GENERAL"))
        await fake.push_event(fake.message("<@U0BOT>: what's up?", channel="C0GENERAL"))
        await fake.push_event(fake.message("hi <@U0BOT|tidegate>", channel="G0PRIVATE",
                                           user="U0BOB"))
        await inbox.wait(3)
        plain, mention, private = inbox.messages
        assert (plain.chat_type, plain.group_id, plain.mentions_bot) == (
            "channel", "C0GENERAL", False)
        assert (mention.mentions_bot, mention.text) == (True, "what's up?")
        assert (private.chat_type, private.group_id, private.mentions_bot) == (
            "group", "G0PRIVATE", True)
        assert private.text == "hi <@U0BOT|tidegate>"  # only a leading mention is stripped
        assert private.sender_name == "Bob Builder" and private.sender_username == "bob"


async def test_app_mention_and_its_message_share_a_message_id(fake: FakeSlack) -> None:
    async with running(fake) as (_ch, inbox):
        ts = fake.next_ts()
        await fake.push_event(fake.message("<@U0BOT> deploy", ts=ts))
        await fake.push_event(fake.app_mention("<@U0BOT> deploy", ts=ts))
        await inbox.wait(2)
        a, b = inbox.messages
        assert a.message_id == b.message_id == f"C0GENERAL:{ts}"
        assert a.mentions_bot and b.mentions_bot and a.text == b.text == "deploy"
        assert a.chat_type == b.chat_type == "channel"


async def test_thread_reply_and_reply_lands_in_thread(fake: FakeSlack) -> None:
    async with running(fake) as (ch, inbox):
        parent = "1767225600.000100"
        await fake.push_event(fake.message("and another thing", thread_ts=parent,
                                           parent_user_id="U0BOT"))
        await fake.push_event(fake.dm("in a dm thread", thread_ts=parent))
        await inbox.wait(2)
        msg, dm = inbox.messages
        assert (msg.chat_type, msg.group_id, msg.thread_id) == ("thread", "C0GENERAL", parent)
        assert msg.reply_to == f"C0GENERAL:{parent}"
        assert msg.mentions_bot  # a reply in the bot's own thread addresses the bot
        assert (dm.chat_type, dm.peer_id, dm.thread_id) == ("dm", "U0ALICE", parent)

        result = await ch.send(OutboundMessage(channel="slack", to=msg.group_id or "",
                                               thread_id=msg.thread_id, text="on it"))
        assert result.ok and len(result.message_ids) == 1
        sent = fake.messages("C0GENERAL")[-1]
        assert sent["thread_ts"] == parent and sent["text"] == "on it"


async def test_own_messages_are_dropped_other_bots_flagged(fake: FakeSlack) -> None:
    async with running(fake) as (ch, inbox):
        await ch.send(OutboundMessage(channel="slack", to="C0GENERAL", text="bot says hi"))
        # The fake echoes the post back as a message event, as Slack does.
        await wait_until(lambda: any(e["payload"]["event"].get("user") == "U0BOT"
                                     for e in fake.envelopes))
        await fake.push_event(fake.message("self again", user="U0BOT", bot_id="B0BOT"))
        await fake.push_event(fake.message("beep", user="U0OTHERBOT", bot_id="B0OTHER"))
        await inbox.wait(1)
        await asyncio.sleep(0.1)
        assert [m.text for m in inbox.messages] == ["beep"]
        assert inbox.messages[0].is_bot and inbox.messages[0].sender_id == "U0OTHERBOT"


async def test_malformed_payloads_are_logged_and_skipped(fake: FakeSlack) -> None:
    async with running(fake) as (ch, inbox):
        with structlog.testing.capture_logs() as logs:
            await fake.push_event({"type": "message", "channel": "C0GENERAL", "text": "no ts"})
            await fake.push_event({"type": "message", "channel": "C0GENERAL", "ts": "1.2",
                                   "user": "U0ALICE", "text": 42})
            await fake.push_event({"type": "reaction_added", "user": "U0ALICE",
                                   "reaction": "x", "item": "not-an-object"})
            await fake.push_event("not an event object")
            await fake.push_raw("{this is not json")
            await fake.push_event(fake.dm("still alive?"))
            await inbox.wait(1)
            await wait_until(lambda: len(
                [e for e in logs if e["event"] == "slack_event_malformed"]) >= 3)
        assert [m.text for m in inbox.messages] == ["still alive?"]
        assert ch.state == "connected"
        errors = [e["error"] for e in logs if e["event"] == "slack_event_malformed"]
        assert any("'ts'" in e for e in errors) and any("'text'" in e for e in errors)
        assert all(e["account_id"] == "default" for e in logs
                   if e["event"] == "slack_event_malformed")


async def test_redelivered_event_keeps_message_id(fake: FakeSlack) -> None:
    async with running(fake) as (_ch, inbox):
        env = await fake.push_event(fake.dm("once"))
        await inbox.wait(1)
        again = await fake.redeliver(env)
        assert again["retry_attempt"] == 1 and again["envelope_id"] != env["envelope_id"]
        await inbox.wait(2)
        first, second = inbox.messages
        assert first.message_id == second.message_id  # the gateway dedupes on it
        await wait_until(lambda: {env["envelope_id"], again["envelope_id"]}
                         <= {a["envelope_id"] for a in fake.acks})


async def test_slash_command_becomes_message(fake: FakeSlack) -> None:
    async with running(fake) as (_ch, inbox):
        env = await fake.push_command("/new", "fresh start")
        await inbox.wait(1)
        msg = inbox.messages[0]
        assert (msg.text, msg.chat_type, msg.peer_id) == ("/new fresh start", "dm", "U0ALICE")
        assert msg.mentions_bot and msg.sender_username == "alice"
        await wait_until(lambda: any(a["envelope_id"] == env["envelope_id"] for a in fake.acks))


async def test_reactions_edits_deletes_become_channel_events(fake: FakeSlack) -> None:
    async with running(fake) as (_ch, inbox):
        ts = "1767225600.000100"
        await fake.push_event(fake.reaction("thumbsup", item_ts=ts, channel="C0GENERAL"))
        await fake.push_event(fake.edit(channel="D0ALICE", ts=ts, text="new words",
                                        old_text="old words"))
        await fake.push_event(fake.edit(channel="C0GENERAL", ts=ts, text="threaded edit",
                                        old_text="x", thread_ts="1767225500.000001"))
        await fake.push_event(fake.delete(channel="C0GENERAL", ts=ts))
        # Ignored: the bot's own reaction, and Slack re-rendering our post (unfurl).
        await fake.push_event(fake.reaction("eyes", item_ts=ts, user="U0BOT"))
        await fake.push_event(fake.edit(channel="C0GENERAL", ts=ts, text="x", user="U0BOT"))
        await inbox.wait(4, events=True)
        await asyncio.sleep(0.1)
        assert [e.kind for e in inbox.events] == ["reaction", "edit", "edit", "delete"]
        react, edit, tedit, delete = inbox.events
        assert (react.chat_type, react.group_id, react.sender_id) == (
            "channel", "C0GENERAL", "U0ALICE")
        assert ":thumbsup:" in react.text and "bot's message" in react.text
        assert (edit.chat_type, edit.peer_id, edit.group_id) == ("dm", "U0ALICE", None)
        assert "new words" in edit.text
        assert (tedit.chat_type, tedit.thread_id) == ("thread", "1767225500.000001")
        assert delete.group_id == "C0GENERAL" and ts in delete.text
        assert inbox.messages == []


# --------------------------------------------------------------------------- outbound


async def test_long_reply_is_split_under_the_limit_in_thread(fake: FakeSlack) -> None:
    text = "\n\n".join(f"Paragraph {i}: " + "lorem ipsum dolor " * 45 for i in range(30))
    async with running(fake) as (ch, _inbox):
        result = await ch.send(OutboundMessage(channel="slack", to="C0GENERAL", text=text,
                                               thread_id="1767225600.000100"))
    sent = fake.messages()
    assert result.ok and len(sent) >= 6 and len(result.message_ids) == len(sent)
    assert all(len(p["text"]) <= LIMIT for p in sent)
    assert all(p["channel"] == "C0GENERAL" and p["thread_ts"] == "1767225600.000100"
               for p in sent)
    assert sent[0]["text"].startswith("Paragraph 0:") and "Paragraph 29:" in sent[-1]["text"]
    # Nothing lost or reordered: every paragraph appears once, in order.
    joined = "\n\n".join(p["text"] for p in sent)
    positions = [joined.index(f"Paragraph {i}:") for i in range(30)]
    assert positions == sorted(positions)


async def test_dm_reply_to_user_id_uses_the_im_channel(fake: FakeSlack) -> None:
    async with running(fake) as (ch, inbox):
        await fake.push_event(fake.dm("hi"))
        await inbox.wait(1)
        await ch.send(OutboundMessage(channel="slack", to=inbox.messages[0].peer_id,
                                      text="hello"))
    assert posts(fake)[-1]["payload"]["channel"] == "D0ALICE"


async def test_markup_rejection_resends_plain(fake: FakeSlack) -> None:
    fake.fail_next(kind="markup", error="invalid_blocks")
    async with running(fake) as (ch, _inbox):
        result = await ch.send(OutboundMessage(channel="slack", to="C0GENERAL",
                                               text="**bold** & <tag>"))
    assert result.ok
    first, second = posts(fake)
    assert first["error"] == "invalid_blocks" and first["payload"]["mrkdwn"] is True
    assert first["payload"]["text"] == "*bold* &amp; &lt;tag&gt;"
    assert second["payload"]["mrkdwn"] is False
    assert second["payload"]["text"] == "bold &amp; &lt;tag&gt;"  # plain, still escaped
    assert [s["payload"]["text"] for s in fake.sent] == ["bold &amp; &lt;tag&gt;"]


async def test_rate_limit_waits_retry_after_on_the_clock(fake: FakeSlack) -> None:
    clock = FakeClock()
    fake.fail_next(kind="ratelimited", retry_after=7)
    async with running(fake, clock) as (ch, _inbox):
        task = asyncio.create_task(ch.send(OutboundMessage(channel="slack", to="C0GENERAL",
                                                           text="patience")))
        await wait_until(lambda: len(posts(fake)) == 1)
        await asyncio.sleep(0.05)
        assert posts(fake)[0]["status"] == 429
        await clock.advance(6.9)
        await asyncio.sleep(0.05)
        assert len(posts(fake)) == 1 and not task.done()  # still waiting out Retry-After
        await clock.advance(0.2)
        result = await asyncio.wait_for(task, 5)
    assert result.ok and len(posts(fake)) == 2
    assert fake.messages()[0]["text"] == "patience"


async def test_rate_limit_that_persists_is_retryable(fake: FakeSlack) -> None:
    fake.fail_next(kind="ratelimited", retry_after=0, count=10)  # real clock: no waiting
    async with running(fake, SYSTEM_CLOCK) as (ch, _inbox):
        result = await ch.send(OutboundMessage(channel="slack", to="C0GENERAL", text="x"))
    assert not result.ok and result.retryable and len(posts(fake)) == 3


async def test_permanent_error_is_not_retryable(fake: FakeSlack) -> None:
    fake.fail_next(kind="error", error="channel_not_found")
    async with running(fake) as (ch, _inbox):
        result = await ch.send(OutboundMessage(channel="slack", to="C0NOPE", text="x"))
    assert not result.ok and not result.retryable and "channel_not_found" in result.error


async def test_typing_uses_assistant_status_in_threads_only(fake: FakeSlack) -> None:
    async with running(fake) as (ch, _inbox):
        await ch.typing("C0GENERAL")  # no thread: no API for that
        await ch.typing("C0GENERAL", thread_id="1767225600.000100")
        fake.fail_next("assistant.threads.setStatus", kind="error", error="missing_scope")
        await ch.typing("C0GENERAL", thread_id="1767225600.000100")  # refused: turns it off
        await ch.typing("C0GENERAL", thread_id="1767225600.000100")
    calls = [c for c in fake.calls if c["method"] == "assistant.threads.setStatus"]
    assert len(calls) == 2
    assert calls[0]["payload"]["channel_id"] == "C0GENERAL"
    assert calls[0]["payload"]["thread_ts"] == "1767225600.000100"


# --------------------------------------------------------------------------- connection


async def test_outage_then_recovery_reconnects(fake: FakeSlack) -> None:
    states: list[str] = []

    async def watch(ch: SlackChannel) -> None:
        while True:
            if not states or states[-1] != ch.state:
                states.append(ch.state)
            await asyncio.sleep(0.002)

    async with running(fake, SYSTEM_CLOCK, reconnect_initial=0.05, reconnect_max=0.2,
                       watch_interval=0.2) as (ch, inbox):
        watcher = asyncio.create_task(watch(ch))
        with structlog.testing.capture_logs() as logs:
            await fake.set_outage(True, "5xx")
            await wait_until(lambda: ch.state == "reconnecting")
            result = await ch.send(OutboundMessage(channel="slack", to="C0GENERAL",
                                                   text="during outage"))
            assert not result.ok and result.retryable
            await asyncio.sleep(0.3)  # several failed reconnect attempts
            assert ch.state == "reconnecting" and ch.status()["last_error"]
            await fake.set_outage(False)
            await wait_until(lambda: ch.state == "connected")
        await asyncio.sleep(0.02)  # let the watcher sample the final state
        watcher.cancel()
        assert states[:3] == ["connected", "reconnecting", "connected"]
        assert fake.connections_opened == 2
        events = [e["event"] for e in logs if e["event"].startswith("slack_")]
        assert "slack_reconnecting" in events and events[-1] == "slack_connected"
        # And it works again.
        await fake.push_event(fake.dm("back?"))
        await inbox.wait(1)
        ok = await ch.send(OutboundMessage(channel="slack", to="C0GENERAL", text="back"))
        assert ok.ok


async def test_dropped_connections_are_unconfirmed_not_resent(fake: FakeSlack) -> None:
    # Written, never answered: the post may exist; the lookup fails too (same outage), so
    # it is unconfirmed, never queued for a blind resend (issue 8 item 5).
    async with running(fake, SYSTEM_CLOCK, reconnect_initial=0.05,
                       reconnect_max=0.2) as (ch, _inbox):
        await fake.set_outage(True, "drop")
        result = await ch.send(OutboundMessage(channel="slack", to="C0GENERAL", text="x"))
        assert not result.ok and result.unconfirmed and not result.retryable
        await fake.set_outage(False)
        await wait_until(lambda: ch.state == "connected")


async def drive(clock: FakeClock, until, step: float = 1.0, rounds: int = 200) -> None:
    """Advance the fake clock in steps (letting real I/O run) until ``until()``."""
    for _ in range(rounds):
        if until():
            return
        await clock.advance(step)
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met while driving the clock")


async def test_connection_refused_backs_off_with_jitter_on_the_clock(fake: FakeSlack) -> None:
    clock = FakeClock()
    async with running(fake, clock, reconnect_initial=2.0, reconnect_max=8.0) as (ch, _inbox):
        with structlog.testing.capture_logs() as logs:
            await fake.set_outage(True, "refuse")
            await wait_until(lambda: ch.state == "reconnecting")
            calls_before = len(fake.calls)
            send = asyncio.create_task(ch.send(OutboundMessage(channel="slack", to="C0GENERAL",
                                                               text="nobody home")))
            await drive(clock, send.done)
            result = send.result()
            assert not result.ok and result.retryable and "ClientConnectorError" in result.error
            await drive(clock, lambda: len([e for e in logs
                                            if e["event"] == "slack_reconnecting"]) >= 5)
            assert len(fake.calls) == calls_before  # nothing got through
            await fake.set_outage(False)
            await drive(clock, lambda: ch.state == "connected")
        delays = [e["retry_in"] for e in logs if e["event"] == "slack_reconnecting"]
        # "connection lost" after a short-lived connection, then failures: 2 s doubling to
        # the 8 s cap, each with 50-100 % jitter.
        for i, d in enumerate(delays[:5]):
            cap = min(8.0, 2.0 * 2 ** i)
            assert cap / 2 <= d <= cap, (i, delays)
        assert len(set(delays)) > 1
        assert fake.connections_opened == 2


async def test_start_during_outage_returns_and_connects_later(fake: FakeSlack) -> None:
    # the outage lasts until the test ends it (a timed one could end before start returns)
    await fake.set_outage(True, "5xx")
    async with running(fake, SYSTEM_CLOCK, reconnect_initial=0.05,
                       reconnect_max=0.1) as (ch, inbox):
        assert ch.state == "reconnecting"
        await fake.set_outage(False)
        await wait_until(lambda: ch.state == "connected")
        await fake.push_event(fake.dm("hello"))
        await inbox.wait(1)


async def test_slack_refresh_disconnect_is_followed(fake: FakeSlack) -> None:
    async with running(fake) as (ch, inbox):
        await fake.send_disconnect()
        await wait_until(lambda: fake.connections_opened == 2 and fake.connected_sockets == 1)
        assert ch.state == "connected"
        await fake.push_event(fake.dm("after refresh"))
        await inbox.wait(1)


@pytest.mark.parametrize("which", ["bot_token", "app_token"])
async def test_rejected_token_fails_cleanly_without_leaking_it(
        fake: FakeSlack, which: str, caplog: pytest.LogCaptureFixture) -> None:
    secret = "xoxb-WRONG-0000-secret" if which == "bot_token" else "xapp-WRONG-0000-secret"
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs:
        async with running(fake, **{which: secret}) as (ch, _inbox):
            assert ch.state == "failed"
            result = await ch.send(OutboundMessage(channel="slack", to="C0GENERAL", text="x"))
            assert not result.ok and not result.retryable
            assert ch.status()["last_error"] == f"{which} rejected: invalid_auth"
    failed = [e for e in logs if e["event"] == "slack_auth_failed"]
    assert len(failed) == 1 and failed[0]["token"] == which
    assert failed[0]["error"] == "invalid_auth" and failed[0]["log_level"] == "error"
    assert secret not in repr(logs) and secret not in caplog.text
    assert not any(c["method"] == "chat.postMessage" for c in fake.calls)


def test_missing_tokens_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match="app_token"):
        SlackChannel("work", SlackAccount(bot_token="xoxb-1"))
    with pytest.raises(ValueError, match="signing_secret"):
        SlackChannel("work", SlackAccount(bot_token="xoxb-1", mode="http"))
    with pytest.raises(ValueError, match="bot_token"):
        SlackChannel("work", SlackAccount(app_token="xapp-1"))


async def test_stop_is_idempotent_and_disabled_does_nothing(fake: FakeSlack) -> None:
    ch = SlackChannel("default", account(fake), clock=FakeClock())
    inbox = Inbox()
    await ch.start(inbox.on_message, inbox.on_event)
    await ch.stop()
    await ch.stop()
    assert ch.state == "stopped"
    off = SlackChannel("off", account(fake, enabled=False))
    await off.start(inbox.on_message, inbox.on_event)
    assert off.state == "disabled" and off.http_routes() == []
    result = await off.send(OutboundMessage(channel="slack", to="C1", text="x"))
    assert not result.ok and not result.retryable


# --------------------------------------------------------------------------- HTTP mode


@asynccontextmanager
async def http_running(fake: FakeSlack, clock: FakeClock, inbox: Inbox | None = None
                       ) -> AsyncIterator[tuple[SlackChannel, Inbox, str]]:
    acc = account(fake, mode="http", app_token=None, signing_secret=fake.signing_secret)
    ch = SlackChannel("default", acc, clock=clock)
    inbox = inbox or Inbox()
    app = web.Application()
    app.add_routes(ch.http_routes())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/slack/events"
    fake.http_target = url
    await ch.start(inbox.on_message, inbox.on_event)
    try:
        yield ch, inbox, url
    finally:
        await ch.stop()
        await runner.cleanup()


async def test_http_events_api(fake: FakeSlack) -> None:
    clock = FakeClock(start=time.time())  # signatures carry the real time
    async with http_running(fake, clock) as (ch, inbox, url):
        assert ch.state == "connected" and ch.http_routes()[0].path == "/slack/events"
        # url_verification handshake
        body = json.dumps({"type": "url_verification", "challenge": "c-123",
                           "token": "t"}).encode()
        ts = str(int(time.time()))
        async with aiohttp.ClientSession() as s, s.post(url, data=body, headers={
                "Content-Type": "application/json", "X-Slack-Request-Timestamp": ts,
                "X-Slack-Signature": sign(fake.signing_secret, ts, body)}) as r:
            assert r.status == 200 and (await r.json()) == {"challenge": "c-123"}
        # an event, then Slack's retry of it (X-Slack-Retry-Num)
        env = await fake.push_event(fake.message("<@U0BOT> over http"))
        await fake.redeliver(env, reason="http_timeout")
        await inbox.wait(2)
        assert fake.http_responses == [200, 200]
        a, b = inbox.messages
        assert a.message_id == b.message_id and a.mentions_bot and a.text == "over http"
        # slash commands arrive form-encoded
        await fake.push_command("/status")
        await inbox.wait(3)
        assert inbox.messages[2].text == "/status" and fake.http_responses[-1] == 200


class HeldInbox(Inbox):
    """An Inbox whose ``on_message`` returns (the gateway has journaled the message) only
    once ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def on_message(self, msg: InboundMessage) -> None:
        await super().on_message(msg)
        await self.release.wait()


async def test_http_event_not_accepted_in_time_answers_503_and_its_retry_200(
        fake: FakeSlack) -> None:
    from channels.slack.adapter import ACCEPT_WAIT
    clock = FakeClock(start=time.time())  # signatures carry the real time
    inbox = HeldInbox()
    async with http_running(fake, clock, inbox) as (_ch, _inbox, _url):
        with structlog.testing.capture_logs() as logs:
            first = asyncio.ensure_future(fake.push_event(fake.dm("held")))
            await inbox.wait(1)
            await clock.advance(ACCEPT_WAIT)
            env = await first
            assert fake.http_responses == [503]  # not 2xx: Slack retries (http_error)
            retry = asyncio.ensure_future(fake.redeliver(env, reason="http_error"))
            await wait_until(lambda: any(e["event"] == "slack_redelivery_joined"
                                         for e in logs))
            inbox.release.set()
            await retry
        assert fake.http_responses == [503, 200]
        assert [m.text for m in inbox.messages] == ["held"]  # handed over once
        [withheld] = [e for e in logs if e["event"] == "slack_ack_withheld"]
        assert withheld["event_id"] == env["payload"]["event_id"]
        assert withheld["waited_s"] == ACCEPT_WAIT and withheld["kind"] == "event"
        assert not [e for e in logs if e["event"] == "slack_event_rejected"]


async def test_stop_before_acceptance_sends_no_ack(fake: FakeSlack) -> None:
    inbox = HeldInbox()
    ch = SlackChannel("default", account(fake), clock=FakeClock())
    await ch.start(inbox.on_message, inbox.on_event)
    with structlog.testing.capture_logs() as logs:
        try:
            env = await fake.push_event(fake.dm("mid-journal when stopped"))
            await inbox.wait(1)
        finally:
            await ch.stop()  # the gateway never returned from on_message
    assert env["envelope_id"] not in {a["envelope_id"] for a in fake.acks}
    [withheld] = [e for e in logs if e["event"] == "slack_ack_withheld"]
    assert withheld["reason"] == "stopping"


async def test_http_rejects_bad_and_stale_signatures(fake: FakeSlack) -> None:
    clock = FakeClock(start=time.time())
    async with http_running(fake, clock) as (_ch, inbox, _url):
        body = json.dumps(fake.envelope(fake.dm("forged"))["payload"]).encode()
        with structlog.testing.capture_logs() as logs:
            assert await fake.post_signed(body, secret="not-the-secret") == 401
            assert await fake.post_signed(body, timestamp="not-a-number") == 401
            clock.set_wall(time.time() + 301)  # our clock says the request is 5+ min old
            assert await fake.post_signed(body) == 401
            clock.set_wall(time.time())
            assert await fake.post_signed(b"{broken", content_type="application/json") == 400
            assert await fake.post_signed(body) == 200
        reasons = [e["reason"] for e in logs if e["event"] == "slack_signature_rejected"]
        assert reasons == ["bad signature", "bad timestamp", "stale timestamp"]
        assert fake.signing_secret not in repr(logs)
        await inbox.wait(1)
        assert [m.text for m in inbox.messages] == ["forged"]


# --------------------------------------------------------------------------- the fake itself


async def test_fake_redelivers_unacked_events_up_to_three_times_across_reconnects(
        ) -> None:
    async with FakeSlack(redeliver_after=0.05) as fake, aiohttp.ClientSession() as s:
        async def connect() -> aiohttp.ClientWebSocketResponse:
            async with s.post(fake.api_url + "apps.connections.open", headers={
                    "Authorization": f"Bearer {fake.app_token}"}) as r:
                ws = await s.ws_connect((await r.json())["url"])
            assert (await ws.receive_json())["type"] == "hello"
            return ws

        ws = await connect()
        env = await fake.push_event(fake.dm("never acked"))
        assert (await ws.receive_json())["envelope_id"] == env["envelope_id"]
        await ws.close()  # gone before acking: the retry waits for the next connection
        await wait_until(lambda: len(fake._pending) == 1)
        ws = await connect()
        again = await ws.receive_json()
        assert (again["retry_attempt"], again["retry_reason"]) == (1, "timeout")
        assert again["payload"]["event_id"] == env["payload"]["event_id"]
        attempts = [again["retry_attempt"]]
        while attempts[-1] < 3:
            attempts.append((await ws.receive_json())["retry_attempt"])
        assert attempts == [1, 2, 3]
        acked = await fake.push_event(fake.dm("acked"))
        await ws.receive_json()
        await ws.send_json({"envelope_id": acked["envelope_id"]})
        await wait_until(lambda: fake.acks and not fake._bg)  # every retry timer is done
        assert [e["retry_attempt"] for e in fake.envelopes] == [0, 1, 2, 3, 0]  # no 4th
        await ws.close()
    async with FakeSlack() as fake:  # off by default: never redelivered by itself
        assert fake.redeliver_after is None


async def test_fake_in_a_thread_is_driven_through_control_endpoints() -> None:
    handle = start_in_thread()
    try:
        fake = handle.fake
        async with running(fake) as (ch, inbox):
            ctl = handle.control
            await asyncio.to_thread(ctl, "event", {"kind": "dm", "text": "via control"})
            await inbox.wait(1)
            assert inbox.messages[0].text == "via control"
            env = (await asyncio.to_thread(ctl, "event", {"kind": "mention", "text": "x"}))[
                "envelope"]
            await inbox.wait(2)  # accepted: a retry while it is pending would join it
            await asyncio.to_thread(ctl, "redeliver", {"envelope_id": env["envelope_id"]})
            await inbox.wait(3)
            assert inbox.messages[1].message_id == inbox.messages[2].message_id
            await asyncio.to_thread(ctl, "fail", {"kind": "markup"})
            assert (await ch.send(OutboundMessage(channel="slack", to="C0GENERAL",
                                                  text="*hi*"))).ok
            sent = await asyncio.to_thread(ctl, "sent")
            assert [s["payload"]["mrkdwn"] for s in sent] == [False]
            state = await asyncio.to_thread(ctl, "state")
            assert state["connected_sockets"] == 1 and state["outage"] is None
            assert (await asyncio.to_thread(ctl, "outage", {"on": True, "duration": 0.2}))["ok"]
            await wait_until(lambda: fake.outage is None)
    finally:
        handle.stop()
