"""Stream pacing by Slack's rate-limit tiers (issue 13 "Streamed replies": edits throttled
"per Slack's tier limits for Slack").

Slack limits Web API calls per method, per workspace, per app, per minute
(https://docs.slack.dev/apis/web-api/rate-limits): Tier 2 allows 20+ calls a minute, Tier 3
50+, Tier 4 100+ ("sporadic bursts are welcome"); ``chat.postMessage`` about one message a
second per channel. A stream's own ``min_interval`` (channels/outbound/streaming.py) spaces the
updates of one reply, but all replies streaming at once in one workspace share each
method's budget. ``TierPacer`` is that shared budget, one per Slack account (bot token =
workspace): a sliding window per method — a call goes out at once while fewer than the
tier's calls went out in the last 60 s, else it waits (on the injected clock) for the slot
when the oldest of them leaves the window; so no 60-second window ever holds more than
the tier allows, and a short burst of replies is not slowed at all. ``chat.postMessage``
is spaced one second apart per channel. A 429's ``Retry-After`` holds the method back for
every reply. Interim updates leave the last ``RESERVE`` share of a window to final texts:
when it is reached, or an interim update would wait more than ``INTERIM_WAIT``, it is
skipped (the text catches up with the next one); a reply's first post and its final update
always wait for their slot. The window is ``MARGIN`` longer than Slack's minute, since a
call reaches Slack a little after its slot.

Tiers used (the floor of each tier's range): ``chat.update``, ``chat.delete`` Tier 3;
``chat.appendStream`` Tier 4; ``chat.startStream``, ``chat.stopStream`` Tier 2. Because
``chat.startStream`` is the tight one, a reply that would wait more than
``NATIVE_START_WAIT`` for its start slot streams by ``chat.postMessage`` + ``chat.update``
instead (channels/slack/outbound.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from channels.outbound.delivery import RateLimited
from runtime.clock import Clock

T = TypeVar("T")

PER_MINUTE = {2: 20, 3: 50, 4: 100}
METHOD_TIER = {"chat_update": 3, "chat_delete": 3, "chat_appendStream": 4,
               "chat_startStream": 2, "chat_stopStream": 2}
WINDOW = 60.0  # s: Slack counts tiers per minute
MARGIN = 1.0  # s added to the window: calls reach Slack a little after their slot
RESERVE = 0.2  # share of a window's calls interim updates leave for final texts
POST_INTERVAL = 1.0  # s between chat.postMessage calls to one channel
NATIVE_START_WAIT = 1.0  # s a reply may wait for chat.startStream before it edits instead
INTERIM_WAIT = 2.0  # s an interim update may wait; beyond, it is skipped (the final is not)


def budget_of(method: str) -> tuple[int, float] | None:
    """``(calls, per seconds)`` for ``method`` (slack-sdk's name, e.g. ``chat_update``);
    None for methods not paced here."""
    if method == "chat_postMessage":
        return 1, POST_INTERVAL
    tier = METHOD_TIER.get(method)
    return (PER_MINUTE[tier], WINDOW + MARGIN) if tier else None


class TierPacer:
    """The streamed-call budget of one Slack workspace (see the module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._slots: dict[str, deque[float]] = {}  # key -> the last `calls` slots taken
        self._held: dict[str, float] = {}  # key -> no call before (monotonic s), after a 429

    @staticmethod
    def _key(method: str, channel: str | None) -> str:
        return f"{method}:{channel}" if method == "chat_postMessage" else method

    def _free(self, key: str, budget: tuple[int, float]) -> float:
        calls, per = budget
        slots = self._slots.get(key)
        free = max(self._clock.monotonic(), self._held.get(key, 0.0))
        if slots is not None and len(slots) >= calls:
            free = max(free, slots[0] + per)  # the oldest of the last `calls` leaves
        return free

    async def wait(self, method: str, channel: str | None = None) -> float:
        """Take ``method``'s next slot and sleep until it; returns the seconds waited."""
        budget = budget_of(method)
        if budget is None:
            return 0.0
        key = self._key(method, channel)
        slot = self._free(key, budget)
        self._slots.setdefault(key, deque(maxlen=budget[0])).append(slot)
        wait = slot - self._clock.monotonic()
        if wait > 0:
            await self._clock.sleep(wait)
        return max(0.0, wait)

    def delay(self, method: str, channel: str | None = None) -> float:
        """Seconds until ``method``'s next free slot (0: a call would go out at once)."""
        budget = budget_of(method)
        if budget is None:
            return 0.0
        return self._free(self._key(method, channel), budget) - self._clock.monotonic()

    def skip_interim(self, method: str) -> bool:
        """True when an interim (not final) update by ``method`` should be skipped: it
        would wait more than ``INTERIM_WAIT``, or the window has no more than the
        ``RESERVE`` share of its calls left, which is kept for final texts."""
        budget = budget_of(method)
        if budget is None:
            return False
        calls, per = budget
        now = self._clock.monotonic()
        used = sum(1 for slot in self._slots.get(method, ()) if slot > now - per)
        return used >= calls - max(1, int(calls * RESERVE)) or self.delay(method) > \
            INTERIM_WAIT

    def rate_limited(self, method: str, retry_after: float, channel: str | None = None
                     ) -> None:
        """Slack answered 429: no call of ``method`` before ``retry_after`` seconds."""
        key = self._key(method, channel)
        until = self._clock.monotonic() + max(0.0, retry_after)
        self._held[key] = max(self._held.get(key, 0.0), until)


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
