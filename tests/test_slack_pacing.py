"""Stream pacing by Slack's tier limits (issue 13 "Streamed replies"): the real SlackChannel
(slack-sdk) streams several replies at once against the fake Slack; the adapter's clock is
a FakeClock, and the calls the fake received are counted as it is advanced. Tiers:
channels/slack/pacing.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from channels.base import OutboundMessage
from channels.outbound.delivery import RateLimited
from channels.slack.adapter import SlackChannel
from channels.slack.native_stream import SlackNativeStream
from channels.slack.pacing import MARGIN, WINDOW
from channels.slack.stream import SlackStream
from runtime.clock import FakeClock
from tests.channel_harness import started_slack
from tests.fakes.fake_slack import FakeSlack

pytestmark = pytest.mark.timeout(60)
CHANNEL = "C0GENERAL"


async def until(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def sender(ch: SlackChannel, thread: str | None = None) -> Any:
    msg = OutboundMessage(channel="slack", to=CHANNEL, text="", thread_id=thread)
    return ch.stream_sender(msg, "channel", mode="partial", recipient="U0ALICE")


def count(slack: FakeSlack, method: str) -> int:
    return sum(1 for s in slack.sent if s["method"] == method)


async def grow(stream: Any, n: int, *, markdown: bool = False, finals: bool = False) -> None:
    """One post, then ``n`` updates; the last is final (all are with ``finals``: block
    mode's parts, say, each a final text)."""
    text = "word"
    for i in range(n + 1):
        await stream.show(0, text, formatted=not markdown, final=finals or i == n)
        text += " word"


async def test_no_window_holds_more_than_tier_3(slack):
    clock = FakeClock()
    ch = await started_slack(slack, clock)
    try:
        streams = [sender(ch) for _ in range(3)]
        assert all(isinstance(s, SlackStream) for s in streams)
        work = [asyncio.create_task(grow(s, 30, finals=True)) for s in streams]
        await until(lambda: count(slack, "chat.update") >= 30)
        await asyncio.sleep(0.1)
        # the three first posts go to one channel: one a second
        assert count(slack, "chat.postMessage") == 1
        await clock.advance(1.0)  # t = 1 s: the second reply posts, then updates
        await until(lambda: count(slack, "chat.update") == 50)  # Tier 3: 50 a minute
        assert count(slack, "chat.postMessage") == 2
        await clock.advance(1.0)  # t = 2 s: the third posts, its updates wait
        await until(lambda: count(slack, "chat.postMessage") == 3)
        for _ in range(58):  # up to t = 60 s: not one more
            await clock.advance(1.0)
            await asyncio.sleep(0.005)
        assert count(slack, "chat.update") == 50
        await clock.advance(WINDOW + MARGIN - 60 + 0.1)  # the 30 slots of t=0 s leave
        await until(lambda: count(slack, "chat.update") == 80)
        await asyncio.sleep(0.05)
        assert count(slack, "chat.update") == 80  # the 20 of t=1 s leave 1 s later
        await clock.advance(1.0)
        for w in work:
            await w
        assert count(slack, "chat.update") == 90
        assert [t.count("word") for t in slack.chat_view(CHANNEL)] == [31] * 3
    finally:
        await ch.stop()


async def test_interim_updates_leave_room_for_the_finals(slack):
    clock = FakeClock()
    ch = await started_slack(slack, clock)
    try:
        work = [asyncio.create_task(grow(sender(ch), 30)) for _ in range(3)]
        await until(lambda: count(slack, "chat.update") == 30)  # t = 0: all of the first
        await clock.advance(1.0)
        await until(lambda: count(slack, "chat.update") == 41)  # 10 interim, then final
        await clock.advance(1.0)
        for w in work:  # the third's interim updates are skipped, its final goes at once
            await w
        assert count(slack, "chat.update") == 42
        assert [t.count("word") for t in slack.chat_view(CHANNEL)] == [31] * 3
    finally:
        await ch.stop()


async def test_a_429_holds_the_method_for_its_retry_after(slack):
    clock = FakeClock()
    ch = await started_slack(slack, clock)
    try:
        stream = sender(ch)
        await stream.show(0, "one", formatted=True, final=False)
        slack.fail_next("chat.update", retry_after=5)
        await clock.advance(1.0)
        with pytest.raises(RateLimited):
            await stream.show(0, "one two", formatted=True, final=False)
        other = sender(ch)  # another reply in the workspace waits too
        await other.show(0, "first", formatted=True, final=False)
        edit = asyncio.create_task(other.show(0, "first edit", formatted=True, final=True))
        await clock.advance(4.5)
        await asyncio.sleep(0.1)
        assert count(slack, "chat.update") == 0 and not edit.done()
        await clock.advance(1.0)
        await until(edit.done)
        assert count(slack, "chat.update") == 1
    finally:
        await ch.stop()


async def test_native_streams_pace_appends_and_fall_back_when_start_is_busy(slack):
    clock = FakeClock()
    ch = await started_slack(slack, clock)
    try:
        first = sender(ch, thread="1767225600.000100")
        assert isinstance(first, SlackNativeStream)
        await first.show(0, "word", formatted=False, final=False)
        # chat.startStream is Tier 2 (20 a minute): the 21st reply of the minute edits
        for i in range(19):
            other = sender(ch, thread=f"1767225700.{i:06d}")
            assert isinstance(other, SlackNativeStream)
            await other.show(0, "hi", formatted=False, final=False)
        assert count(slack, "chat.startStream") == 20
        assert isinstance(sender(ch, thread="1767225800.000001"), SlackStream)
        await grow(first, 105, markdown=True)  # Tier 4: 100 a minute, 20 kept for finals
        assert count(slack, "chat.appendStream") == 81  # 80 interim, then the final
        assert count(slack, "chat.stopStream") == 1
        await clock.advance(WINDOW + MARGIN)
        assert isinstance(sender(ch, thread="1767225800.000002"), SlackNativeStream)
    finally:
        await ch.stop()
