"""Gateway delivery with the outbox: a reply that keeps failing is kept ONCE and delivered
ONCE when the platform is back (never multiplied by the outbox's own retries)."""

import asyncio

from channels.base import DeliveryResult, OutboundMessage
from channels.outbound.outbox import Outbox
from gateway.outbound.delivery import Deliverer
from gateway.routing import Route
from runtime.clock import FakeClock


class FlakyChannel:
    name = "telegram"
    account_id = "default"
    state = "connected"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts = 0
        self.delivered: list[str] = []

    async def send(self, msg: OutboundMessage) -> DeliveryResult:
        self.attempts += 1
        if self.attempts <= self.failures:
            return DeliveryResult(ok=False, error="502 bad gateway", retryable=True)
        self.delivered.append(msg.text)
        return DeliveryResult(ok=True, message_ids=[str(self.attempts)])

    async def typing(self, to, thread_id=None) -> None:
        return None

    def status(self) -> dict:
        return {"state": self.state}


async def test_failed_reply_is_kept_once_and_delivered_once(tmp_path):
    clock = FakeClock()
    outbox = Outbox(tmp_path / "outbox", clock)
    deliverer = Deliverer(clock=clock, outbox=outbox)
    channel = FlakyChannel(failures=6)
    deliverer.register(channel)
    stop = asyncio.Event()
    runner = asyncio.ensure_future(outbox.run(deliverer.retry_from_outbox, stop))
    result = await deliverer.send(Route("telegram", "42"), "the only reply")
    assert not result.ok and outbox.pending() == 1
    for _ in range(40):  # well past five retries (5 s, 30 s, 2 min, 10 min, 30 min ...)
        await clock.advance(600)
        assert outbox.pending() <= 1
        assert len(list((tmp_path / "outbox").glob("*.json"))) <= 1
    assert channel.delivered == ["the only reply"]
    assert outbox.pending() == 0
    stop.set()
    outbox.wake()
    await asyncio.wait_for(runner, 2)


def test_message_tool_target_padding_still_suppresses_the_final_text():
    """`to: " 3106"` is the same chat as 3106 for the platform, so it is for the
    one-reply-per-target rule too (QA: padded ids sent the digest twice)."""
    from gateway.outbound.delivery import Deliverer
    from gateway.routing import Route

    d = Deliverer()
    d.note_tool_send("k", Route("telegram", " 3106 "), "Daily digest: 3 items")
    assert d.reached_by_tool("k", Route("telegram", "3106"), "Daily digest: 3 items")


def test_outbox_waiting_groups_by_account_and_marks_a_minute_old_reply_stuck(tmp_path):
    """``Outbox.waiting`` (what ``status`` turns into problems): one group per channel
    account, oldest first; an entry is stuck once a minute old, even before a retry."""
    clock = FakeClock()
    box = Outbox(tmp_path / "outbox", clock)
    box.put(OutboundMessage(channel="telegram", to="1", text="a", account_id="work"), "e1")
    clock.set_wall(clock.time() + 30)
    box.put(OutboundMessage(channel="slack", to="C1", text="b"), "e2")
    assert [(g["channel"], g["account_id"], g["count"], g["stuck"], g["oldest_age_s"])
            for g in box.waiting()] == [("telegram", "work", 1, 0, 30.0),
                                        ("slack", "default", 1, 0, 0.0)]
    assert [(g["channel"], g["stuck"]) for g in box.waiting(now=clock.time() + 30)] == [
        ("telegram", 1), ("slack", 0)]
