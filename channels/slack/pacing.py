"""Stream pacing by Slack's rate-limit tiers (issue 13 "Streamed replies": edits throttled
"per Slack's tier limits for Slack").

Slack limits Web API calls per method, per workspace, per app
(https://docs.slack.dev/apis/web-api/rate-limits): Tier 2 allows 20+ calls a minute, Tier 3
50+, Tier 4 100+; ``chat.postMessage`` about one message a second per channel. A stream's
own ``min_interval`` (channels/streaming.py) spaces the updates of one reply, but several
replies streaming at once in one workspace share each method's budget. ``TierPacer`` is
that shared budget: one per Slack account (bot token = workspace), every streamed call
takes the method's next free slot, ``60 / calls_per_minute`` seconds after the previous
one, and waits for it on the injected clock. A 429's ``Retry-After`` pushes the method's
next slot out by that long.

Tiers used (the floor of each tier's range): ``chat.update``, ``chat.delete`` Tier 3;
``chat.appendStream`` Tier 4; ``chat.startStream``, ``chat.stopStream`` Tier 2;
``chat.postMessage`` one a second per channel. Because ``chat.startStream`` is the tight
one, a reply that would wait more than ``NATIVE_START_WAIT`` for its start slot streams
by ``chat.postMessage`` + ``chat.update`` instead (channels/slack/outbound.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from channels.delivery import RateLimited
from runtime.clock import Clock

T = TypeVar("T")

PER_MINUTE = {2: 20, 3: 50, 4: 100}
METHOD_TIER = {"chat_update": 3, "chat_delete": 3, "chat_appendStream": 4,
               "chat_startStream": 2, "chat_stopStream": 2}
POST_INTERVAL = 1.0  # s between chat.postMessage calls to one channel
NATIVE_START_WAIT = 1.0  # s a reply may wait for chat.startStream before it edits instead


def interval_of(method: str) -> float:
    """Seconds between two calls of ``method`` (slack-sdk's name, e.g. ``chat_update``);
    0 for methods not paced here."""
    if method == "chat_postMessage":
        return POST_INTERVAL
    tier = METHOD_TIER.get(method)
    return 60.0 / PER_MINUTE[tier] if tier else 0.0


class TierPacer:
    """The streamed-call budget of one Slack workspace (see the module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._next: dict[str, float] = {}  # method (postMessage: per channel) -> monotonic s

    @staticmethod
    def _key(method: str, channel: str | None) -> str:
        return f"{method}:{channel}" if method == "chat_postMessage" else method

    async def wait(self, method: str, channel: str | None = None) -> float:
        """Take ``method``'s next slot and sleep until it; returns the seconds waited."""
        interval = interval_of(method)
        if interval <= 0:
            return 0.0
        key = self._key(method, channel)
        now = self._clock.monotonic()
        slot = max(now, self._next.get(key, now))
        self._next[key] = slot + interval
        if slot > now:
            await self._clock.sleep(slot - now)
        return slot - now

    def delay(self, method: str, channel: str | None = None) -> float:
        """Seconds until ``method``'s next free slot (0: a call would go out at once)."""
        free = self._next.get(self._key(method, channel), 0.0)
        return max(0.0, free - self._clock.monotonic())

    def rate_limited(self, method: str, retry_after: float, channel: str | None = None
                     ) -> None:
        """Slack answered 429: no call of ``method`` before ``retry_after`` seconds."""
        key = self._key(method, channel)
        until = self._clock.monotonic() + max(0.0, retry_after)
        self._next[key] = max(self._next.get(key, 0.0), until)


async def paced(pacer: TierPacer | None, method: str, channel: str | None,
                call: Callable[[], Awaitable[T]]) -> T:
    """``call()`` in ``method``'s next slot (at once without a pacer); a RateLimited it
    raises is noted on the pacer and re-raised."""
    if pacer is None:
        return await call()
    await pacer.wait(method, channel)
    try:
        return await call()
    except RateLimited as exc:
        pacer.rate_limited(method, exc.retry_after, channel)
        raise
