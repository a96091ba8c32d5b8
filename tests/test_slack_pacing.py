"""Stream pacing by Slack's tier limits (issue 13 "Streamed replies"): the real SlackChannel
(slack-sdk) streams several replies at once against the fake Slack; the adapter's clock is
a FakeClock, and the calls the fake received are counted as it is advanced. Tiers:
channels/slack/pacing.py."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from channels.base import OutboundMessage
from channels.delivery import RateLimited
from channels.slack.adapter import SlackChannel
from channels.slack.native_stream import SlackNativeStream
from channels.slack.pacing import interval_of
from channels.slack.stream import SlackStream
from runtime.clock import FakeClock
from tests.channel_harness import started_slack
from tests.fakes.fake_slack import FakeSlack

pytestmark = pytest.mark.timeout(60)
CHANNEL = "C0GENERAL"
UPDATE = interval_of("chat_update")  # 1.2 s: Tier 3, 50 a minute


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


async def grow(stream: Any, n: int) -> None:
    text = "word"
    for _ in range(n + 1):  # the first show posts, the others edit
        await stream.show(0, text, formatted=True, final=False)
        text += " word"


async def test_three_replies_share_chat_update_tier_3(slack):
    clock = FakeClock()
    ch = await started_slack(slack, clock)
    try:
        streams = [sender(ch) for _ in range(3)]
        assert all(isinstance(s, SlackStream) for s in streams)
        work = [asyncio.create_task(grow(s, 20)) for s in streams]
        t = 0.0
        while not all(w.done() for w in work):
            # calls due by now: slots 0, 1.2, 2.4 ... (margin for float rounding)
            low = min(60, math.floor((t - 0.01) / UPDATE) + 1) if t > 0.01 else 1
            high = math.floor((t + 0.01) / UPDATE) + 1
            await until(lambda low=low: count(slack, "chat.update") >= low or all(
                w.done() for w in work))
            await asyncio.sleep(0.01)
            assert count(slack, "chat.update") <= high, f"too many updates at t={t:.1f}"
            if t < 2.5:  # three first posts to one channel: one a second
                assert count(slack, "chat.postMessage") <= math.floor(t + 0.01) + 1
            await clock.advance(0.4)
            t += 0.4
            assert t < 120, "the streams never finished"
        assert count(slack, "chat.update") == 60
        assert 70.0 < t < 75.0  # 59 slots of 1.2 s after the first: no faster, no slower
        for w in work:
            w.result()
    finally:
        await ch.stop()


async def test_a_429_holds_the_method_for_its_retry_after(slack):
    clock = FakeClock()
    ch = await started_slack(slack, clock)
    try:
        stream = sender(ch)
        await stream.show(0, "one", formatted=True, final=False)
        slack.fail_next("chat.update", retry_after=5)
        await clock.advance(UPDATE)
        with pytest.raises(RateLimited):
            await stream.show(0, "one two", formatted=True, final=False)
        other = sender(ch)  # another reply in the workspace waits too
        await other.show(0, "first", formatted=True, final=False)
        edit = asyncio.create_task(other.show(0, "first edit", formatted=True, final=False))
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
        # chat.startStream is Tier 2 (one per 3 s): a second reply now edits instead
        assert isinstance(sender(ch, thread="1767225600.000200"), SlackStream)
        appends = asyncio.create_task(grow(first, 5))
        await clock.advance(0.1)
        await until(lambda: count(slack, "chat.appendStream") >= 1)
        await asyncio.sleep(0.05)
        assert count(slack, "chat.appendStream") == 1  # Tier 4: 0.6 s apart
        for _ in range(4):
            await clock.advance(interval_of("chat_appendStream"))
        await until(lambda: count(slack, "chat.appendStream") >= 5)
        await clock.advance(3.0)
        await until(appends.done)
        assert isinstance(sender(ch, thread="1767225600.000300"), SlackNativeStream)
    finally:
        await ch.stop()
