"""DiscordChannel (real discord.py 2.x) against the fake Discord gateway + REST server.

Every test starts tests/fakes/fake_discord/ on 127.0.0.1 (ephemeral port) and the real
adapter against it; the adapter's clock is a FakeClock, so reconnect backoff and long
rate-limit waits are driven by ``clock.advance``. The one real-time wait is the 0.5 s
``retry_after`` discord.py sleeps itself.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from channels.base import ChannelEvent, InboundMessage, OutboundMessage
from channels.discord.adapter import DiscordChannel
from channels.discord.config import DiscordAccount
from channels.outbound.render import render_chunks
from runtime.clock import FakeClock, utc_iso

sys.path.insert(0, str(Path(__file__).parent))
from fakes.fake_discord import FakeDiscord, FakeUser, start_in_thread

pytestmark = pytest.mark.timeout(30)
BACKOFF_MAX = 4.0


async def until(pred: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


class Harness:
    """A started adapter plus what it emitted."""

    def __init__(self, channel: DiscordChannel, clock: FakeClock) -> None:
        self.channel, self.clock = channel, clock
        self.messages: asyncio.Queue[InboundMessage] = asyncio.Queue()
        self.events: asyncio.Queue[ChannelEvent] = asyncio.Queue()

    async def on_message(self, m: InboundMessage) -> None:
        await self.messages.put(m)

    async def on_event(self, e: ChannelEvent) -> None:
        await self.events.put(e)

    async def next_message(self, timeout: float = 5.0) -> InboundMessage:
        return await asyncio.wait_for(self.messages.get(), timeout)

    async def next_event(self, timeout: float = 5.0) -> ChannelEvent:
        return await asyncio.wait_for(self.events.get(), timeout)

    async def send(self, to: str, text: str, **kw: Any):
        return await self.channel.send(OutboundMessage(channel="discord", to=to, text=text,
                                                       **kw))


@pytest.fixture
async def fake():
    f = FakeDiscord()
    await f.start()
    yield f
    await f.stop()


@pytest.fixture
async def make(fake):
    started: list[DiscordChannel] = []

    async def _make(server: FakeDiscord | None = None, *, token: str | None = None,
                    message_content_intent: bool = True) -> Harness:
        server = server or fake
        cfg = DiscordAccount(token=token or server.token, api_base_url=server.api_url,
                             gateway_url=server.gateway_url,
                             message_content_intent=message_content_intent, send_timeout=10)
        clock = FakeClock()
        ch = DiscordChannel("default", cfg, clock=clock, backoff_initial=1.0,
                            backoff_max=BACKOFF_MAX, guild_ready_timeout=0.05,
                            start_timeout=10)
        h = Harness(ch, clock)
        started.append(ch)
        await ch.start(h.on_message, h.on_event)
        return h

    yield _make
    for ch in started:
        await ch.stop()


@pytest.fixture
async def h(make, fake) -> Harness:
    harness = await make()
    assert harness.channel.state == "connected"
    return harness


# ---------------------------------------------------------------------- inbound


async def test_dm_becomes_inbound_message(h: Harness, fake: FakeDiscord) -> None:
    payload = await fake.send_dm("hello there")
    m = await h.next_message()
    assert m.channel == "discord" and m.account_id == "default"
    assert m.chat_type == "dm"
    assert m.peer_id == m.sender_id == fake.alice.id
    assert m.group_id is None and m.thread_id is None
    assert m.sender_name == "Alice A." and m.sender_username == "alice"
    assert m.text == "hello there"
    assert m.message_id == payload["id"]
    assert m.mentions_bot is False and m.is_bot is False and m.reply_to is None
    assert m.received_at == h.clock.time()
    assert m.raw["id"] == payload["id"]  # the gateway payload as received


async def test_group_message_with_and_without_mention(h: Harness, fake: FakeDiscord) -> None:
    await fake.send_guild("just chatting", user=fake.bob)
    plain = await h.next_message()
    assert plain.chat_type == "channel" and plain.group_id == fake.channel_id
    assert plain.mentions_bot is False and plain.text == "just chatting"
    assert plain.sender_id == fake.bob.id and plain.sender_name == "bob"

    await fake.send_guild("what time is it?", mention=True)
    mentioned = await h.next_message()
    assert mentioned.mentions_bot is True
    assert mentioned.text == "what time is it?"  # leading <@BOT> stripped

    mid = fake.message_payload(f"so <@{fake.bot.id}> what now?", mentions=[fake.bot])
    await fake.dispatch("MESSAGE_CREATE", mid)
    inner = await h.next_message()
    assert inner.mentions_bot is True and inner.text == "so @tidebot what now?"

    await fake.send_guild("ping via role", role_mention=True)
    by_role = await h.next_message()
    assert by_role.mentions_bot is True and by_role.text == "ping via role"

    reply = await fake.send_guild("thanks!", reply_to_bot=True)
    replied = await h.next_message()
    assert replied.mentions_bot is True
    assert replied.reply_to == reply["message_reference"]["message_id"]


async def test_thread_message_and_reply_into_thread(h: Harness, fake: FakeDiscord) -> None:
    payload = await fake.send_guild("question in thread", channel_id=fake.thread_id)
    m = await h.next_message()
    assert (m.chat_type, m.group_id, m.thread_id) == ("thread", fake.channel_id, fake.thread_id)

    result = await h.send(m.group_id, "answer", thread_id=m.thread_id, reply_to=m.message_id)
    assert result.ok, result.error
    posts = fake.sent_messages()
    assert [p["path"] for p in posts] == [f"/channels/{fake.thread_id}/messages"]
    assert str(posts[0]["payload"]["message_reference"]["message_id"]) == payload["id"]

    new_thread = await fake.create_thread("fresh", parent_id=fake.other_channel_id)
    await fake.send_guild("in a new thread", channel_id=new_thread)
    m2 = await h.next_message()
    assert (m2.chat_type, m2.group_id, m2.thread_id) == (
        "thread", fake.other_channel_id, new_thread)


async def test_own_messages_dropped_other_bots_flagged(h: Harness, fake: FakeDiscord) -> None:
    result = await h.send(fake.channel_id, "bot says hi")  # Discord echoes it back
    assert result.ok
    await fake.send_guild("own message injected", user=fake.bot)
    await fake.send_guild("beep", user=fake.other_bot)
    m = await h.next_message()
    assert m.text == "beep" and m.is_bot is True and m.sender_id == fake.other_bot.id
    await asyncio.sleep(0.05)
    assert h.messages.empty()


async def test_malformed_payload_skipped_and_adapter_keeps_working(
        h: Harness, fake: FakeDiscord) -> None:
    with capture_logs() as logs:
        await fake.dispatch("MESSAGE_CREATE", {"channel_id": fake.channel_id,
                                               "content": "no id, no author"})
        await fake.dispatch("MESSAGE_REACTION_ADD", "not an object")
        await fake.send_dm("still alive")
        m = await h.next_message()
    assert m.text == "still alive"
    bad = [e for e in logs if e["event"] == "discord_event_malformed"]
    assert [e["discord_event"] for e in bad] == ["MESSAGE_CREATE", "MESSAGE_REACTION_ADD"]
    assert h.channel.state == "connected" and fake.identify_count == 1


async def test_redelivered_event_keeps_message_id(h: Harness, fake: FakeDiscord) -> None:
    payload = await fake.send_dm("once")
    await fake.dispatch("MESSAGE_CREATE", payload)
    first, second = await h.next_message(), await h.next_message()
    assert first.message_id == second.message_id == payload["id"]


async def test_empty_content_without_intent_skipped(make) -> None:
    server = FakeDiscord()
    await server.start()
    try:
        h = await make(server, message_content_intent=False)
        assert h.channel.state == "connected"
        await server.send_guild("invisible without the intent")
        await server.send_guild("mentioned", mention=True)
        m = await h.next_message()
        assert m.text == "mentioned"
        await asyncio.sleep(0.05)
        assert h.messages.empty()
    finally:
        await server.stop()


# ---------------------------------------------------------------------- events


async def test_reaction_edit_delete_become_channel_events(h: Harness, fake: FakeDiscord) -> None:
    original = await fake.send_guild("typo hre")
    await h.next_message()
    await fake.react(original["id"], "🎉", user=fake.bob)
    e = await h.next_event()
    assert (e.kind, e.chat_type, e.group_id) == ("reaction", "channel", fake.channel_id)
    assert e.sender_id == fake.bob.id and "🎉" in e.text and original["id"] in e.text

    await fake.react(original["id"], "👀", user=fake.bot)  # the bot's own reaction: ignored
    await fake.edit(original, "typo here")
    e = await h.next_event()
    assert e.kind == "edit" and "typo here" in e.text
    assert e.sender_id == fake.alice.id

    await fake.delete(original)
    e = await h.next_event()
    assert e.kind == "delete" and original["id"] in e.text

    dm = await fake.send_dm("dm to react to")
    await h.next_message()
    await fake.react(dm["id"], "👍", guild=False)
    e = await h.next_event()
    assert (e.kind, e.chat_type, e.peer_id) == ("reaction", "dm", fake.alice.id)
    assert h.events.empty()


# ---------------------------------------------------------------------- outbound


async def test_long_reply_split_under_limit_into_right_channel(
        h: Harness, fake: FakeDiscord) -> None:
    trigger = await fake.send_guild("tell me a lot", mention=True)
    m = await h.next_message()
    text = "\n\n".join(f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 12
                       for i in range(20))
    assert len(text) > 5000
    result = await h.send(m.group_id, text, reply_to=m.message_id)
    assert result.ok, result.error
    posts = fake.sent_messages()
    assert len(posts) >= 3 and len(result.message_ids) == len(posts)
    assert all(p["path"] == f"/channels/{fake.channel_id}/messages" for p in posts)
    assert all(len(p["payload"]["content"]) <= 2000 for p in posts)
    assert str(posts[0]["payload"]["message_reference"]["message_id"]) == trigger["id"]
    assert all("message_reference" not in p["payload"] for p in posts[1:])
    sent_text = " ".join(p["payload"]["content"] for p in posts)
    assert "Paragraph 0:" in sent_text and "Paragraph 19:" in sent_text


async def test_dm_reply_opens_dm_channel(h: Harness, fake: FakeDiscord) -> None:
    result = await h.send(fake.bob.id, "hello bob")
    assert result.ok, result.error
    opens = [s for s in fake.sent if s["path"] == "/users/@me/channels"]
    assert opens and str(opens[0]["payload"]["recipient_id"]) == fake.bob.id
    assert fake.sent_messages()[0]["path"] == f"/channels/{fake.dm_channels[fake.bob.id]}/messages"

    await fake.send_dm("hi bot")  # an inbound DM teaches the adapter alice's DM channel
    m = await h.next_message()
    before = len(fake.sent)
    assert (await h.send(m.peer_id, "hi alice")).ok
    new = fake.sent[before:]
    assert [s["path"] for s in new] == [f"/channels/{fake.dm_channels[fake.alice.id]}/messages"]


async def test_markup_rejection_resends_plain(h: Harness, fake: FakeDiscord) -> None:
    text = "**Bold** and `code`"
    chunk = render_chunks(text, "discord")[0]
    assert chunk.formatted != chunk.plain
    fake.fail_next_sends(1, "markup")
    result = await h.send(fake.channel_id, text)
    assert result.ok, result.error
    posts = [s for s in fake.sent if s["path"].endswith("/messages")]
    assert [p["status"] for p in posts] == [400, 200]
    assert posts[0]["payload"]["content"] == chunk.formatted
    assert posts[1]["payload"]["content"] == chunk.plain


async def test_rate_limit_retry_after_honoured_real_time(h: Harness, fake: FakeDiscord) -> None:
    fake.fail_next_sends(1, "429", retry_after=0.5)
    result = await h.send(fake.channel_id, "after the wait")
    assert result.ok, result.error
    posts = [s for s in fake.sent if s["path"].endswith("/messages")]
    assert [p["status"] for p in posts] == [429, 200]
    assert posts[1]["at"] - posts[0]["at"] >= 0.45


async def test_long_rate_limit_waits_on_clock(h: Harness, fake: FakeDiscord) -> None:
    fake.fail_next_sends(1, "429", retry_after=45)  # above discord.py's 30 s cap
    task = asyncio.create_task(h.send(fake.channel_id, "eventually"))
    await until(lambda: any(s["status"] == 429 for s in fake.sent))
    await until(lambda: h.clock.pending_sleepers() > 0)
    assert not task.done()
    await h.clock.advance(45)
    result = await asyncio.wait_for(task, 5)
    assert result.ok, result.error
    assert [s["status"] for s in fake.sent if s["path"].endswith("/messages")] == [429, 200]


async def test_server_error_is_retryable_failure(h: Harness, fake: FakeDiscord) -> None:
    fake.fail_next_sends(1, "status", status=503)
    result = await h.send(fake.channel_id, "during a 503")
    assert result.ok is False and result.retryable is True
    fake.fail_next_sends(1, "status", status=403)
    result = await h.send(fake.channel_id, "forbidden")
    assert result.ok is False and result.retryable is False
    assert (await h.send(fake.channel_id, "ok again")).ok


async def test_outage_then_reconnect(h: Harness, fake: FakeDiscord) -> None:
    with capture_logs() as logs:
        await fake.set_outage(True)
        await until(lambda: h.channel.state == "reconnecting")
        # the supervisor sleeping its backoff means the old client is closed (a send racing
        # the close is an unknown outcome, proven elsewhere)
        await until(lambda: h.clock.pending_sleepers() > 0)
        result = await h.send(fake.channel_id, "during outage")
        assert result.ok is False and result.retryable is True
        logins = sum(s["path"] == "/users/@me" for s in fake.sent)
        await h.clock.advance(BACKOFF_MAX)  # one more attempt while still down
        await until(lambda: sum(s["path"] == "/users/@me" for s in fake.sent) > logins)
        await until(lambda: h.clock.pending_sleepers() > 0)
        assert h.channel.state == "reconnecting"

        await fake.set_outage(False)
        await h.clock.advance(BACKOFF_MAX)
        await until(lambda: h.channel.state == "connected")
    states = [e["state"] for e in logs if e["event"] == "discord_state"]
    assert states[0] == "reconnecting" and states[-1] == "connected"
    # the fresh client RESUMEs the session it had (channels/discord/resume.py)
    assert fake.identify_count == 1 and fake.resumes[-1]["accepted"]
    assert h.channel.status()["last_error"]
    await fake.send_dm("back online?")
    assert (await h.next_message()).text == "back online?"
    assert (await h.send(fake.channel_id, "yes")).ok


async def test_gateway_drop_resumes_without_backoff(h: Harness, fake: FakeDiscord) -> None:
    await fake.close_gateways(4000)  # a resumable close: discord.py RESUMEs at once
    await until(lambda: fake.resume_count == 1 and fake.connected == 1)
    await until(lambda: h.channel.state == "connected")
    assert fake.identify_count == 1 and h.clock.pending_sleepers() == 0
    await fake.send_dm("after resume")
    assert (await h.next_message()).text == "after resume"


async def test_connection_refused_then_reconnect(h: Harness, fake: FakeDiscord) -> None:
    await fake.set_outage(True, mode="refuse")
    await until(lambda: h.channel.state == "reconnecting")
    result = await h.send(fake.channel_id, "nobody listening")
    assert result.ok is False and result.retryable is True
    await fake.set_outage(False)
    await until(lambda: h.clock.pending_sleepers() > 0)
    await h.clock.advance(BACKOFF_MAX)
    await until(lambda: h.channel.state == "connected")


async def test_typing_posts_once_and_never_raises(h: Harness, fake: FakeDiscord) -> None:
    await h.channel.typing(fake.channel_id)
    await h.channel.typing(fake.channel_id, thread_id=fake.thread_id)
    paths = [s["path"] for s in fake.sent if s["path"].endswith("/typing")]
    assert paths == [f"/channels/{fake.channel_id}/typing", f"/channels/{fake.thread_id}/typing"]
    await h.channel.typing("not-a-number")
    await h.channel.typing("999999999999999999")  # unknown channel: 404 swallowed


async def test_cancelled_typing_never_blocks_later_sends(h: Harness, fake: FakeDiscord) -> None:
    """The typing indicator is cancelled when a turn ends, at any instant. Cancelled inside
    discord.py's rate-limit bookkeeping it used to leave the DM route's bucket empty, and
    every later DM send waited 30 s (seen as all Discord replies timing out after a
    restart). Cancel it after every possible number of loop steps: each following send
    must still go out at once."""
    for steps in range(60):
        user = FakeUser(fake.new_id(), f"user{steps}")
        fake.users[user.id] = user
        typing = asyncio.create_task(h.channel.typing(user.id))
        for _ in range(steps):
            await asyncio.sleep(0)
        typing.cancel()
        with suppress(asyncio.CancelledError):
            await typing
        result = await asyncio.wait_for(h.send(user.id, f"hello {steps}"), 3)
        assert result.ok, (steps, result.error)
    assert len(fake.sent_messages()) == 60


# ---------------------------------------------------------------------- lifecycle


async def test_invalid_token_fails_cleanly(make, fake: FakeDiscord) -> None:
    bad = "definitely-not-the-token"
    with capture_logs() as logs:
        h = await make(token=bad)
        assert h.channel.state == "failed"
        result = await h.send(fake.channel_id, "x")
    assert result.ok is False and result.retryable is False
    failed = [e for e in logs if e["event"] == "discord_channel_failed"]
    assert failed and "401" in failed[0]["reason"]
    assert "401" in h.channel.status()["last_error"]
    assert bad not in repr(logs) and fake.token not in repr(logs)
    assert h.clock.pending_sleepers() == 0  # no retry loop


async def test_privileged_intent_refused_4014(make) -> None:
    server = FakeDiscord(privileged_intents=False)
    await server.start()
    try:
        with capture_logs() as logs:
            h = await make(server)
        assert h.channel.state == "failed"
        reason = h.channel.status()["last_error"]
        assert "4014" in reason and "message_content_intent: false" in reason
        assert any(e["event"] == "discord_channel_failed" for e in logs)
        ok = await make(server, message_content_intent=False)
        assert ok.channel.state == "connected"
    finally:
        await server.stop()


async def test_status_and_idempotent_stop(h: Harness, fake: FakeDiscord) -> None:
    st = h.channel.status()
    assert st["state"] == "connected" and st["account_id"] == "default"
    assert st["bot_id"] == fake.bot.id and st["bot_username"] == "tidebot"
    assert st["connected_since"] == utc_iso(h.clock.time())
    await h.channel.stop()
    await h.channel.stop()
    assert h.channel.state == "stopped"
    result = await h.send(fake.channel_id, "after stop")
    assert result.ok is False and result.retryable is True


async def test_fake_in_thread_driven_by_control_endpoints(make) -> None:
    handle = start_in_thread()
    h: Harness | None = None
    try:
        h = await make(handle.fake)
        async with aiohttp.ClientSession(base_url=handle.url) as http:
            async with http.post("/_control/dm", json={"text": "via control", "user": "bob"}) as r:
                assert r.status == 200
                injected = await r.json()
            m = await h.next_message()
            assert m.text == "via control" and m.message_id == injected["id"]
            async with http.post("/_control/fail", json={"kind": "429", "retry_after": 0.1}):
                pass
            assert (await h.send(m.peer_id, "reply via REST")).ok
            async with http.get("/_control/sent") as r:
                sent = (await r.json())["sent"]
            async with http.get("/_control/state") as r:
                state = await r.json()
        posts = [s for s in sent if s["path"].endswith("/messages")]
        assert [p["status"] for p in posts] == [429, 200]
        assert posts[-1]["payload"]["content"] == "reply via REST"
        assert state["connected"] == 1 and state["users"]["bob"] == m.sender_id
    finally:
        if h is not None:
            await h.channel.stop()
        handle.stop()
