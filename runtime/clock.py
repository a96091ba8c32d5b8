"""Injectable clocks: every piece of code that needs "now", sleeps or timeouts takes one.

``SystemClock`` is the real thing; ``FakeClock`` lets tests drive heartbeat, cron, debounce,
backoff and timeouts by advancing time instead of sleeping (DESIGN.md "Time", seed 002).

All times are seconds (floats). ``time()`` is wall-clock epoch seconds (UTC), ``monotonic()``
never goes backwards.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time as _time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Protocol


class Clock(Protocol):
    """What code that needs time depends on."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch (UTC)."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never decreases."""

    async def sleep(self, seconds: float) -> None:
        """Suspend for ``seconds`` of this clock's time."""

    def timeout(self, seconds: float | None) -> asyncio.Timeout | _FakeTimeout:
        """Async context manager raising ``TimeoutError`` after ``seconds`` (None = never)."""


class SystemClock:
    """The real clock (``time.time``, ``time.monotonic``, ``asyncio.sleep``)."""

    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def timeout(self, seconds: float | None):
        return asyncio.timeout(seconds if seconds is None or seconds > 0 else None)


class FakeClock:
    """A clock that only moves when a test calls :meth:`advance` or :meth:`set_time`.

    Sleepers wake in deadline order; ``advance`` yields to the event loop after each wake
    so that woken tasks can run (and schedule new sleeps) before time moves on.
    """

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._now = float(start)
        self._mono = 1000.0
        self._sleepers: list[tuple[float, int, asyncio.Future]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def set_wall(self, epoch: float) -> None:
        """Step the wall clock (may go backwards) without moving monotonic time."""
        self._now = float(epoch)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), fut))
        await fut

    def pending_sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def next_deadline(self) -> float | None:
        """Seconds until the earliest pending sleeper wakes (None when nobody sleeps)."""
        live = [d for d, _, f in self._sleepers if not f.done()]
        return (min(live) - self._mono) if live else None

    async def settle(self, rounds: int = 20) -> None:
        """Let ready tasks run (several loop iterations) without moving time."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds``, waking sleepers in order."""
        target = self._mono + seconds
        await self.settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, fut = heapq.heappop(self._sleepers)
            if fut.done():
                continue
            step = deadline - self._mono
            self._mono = deadline
            self._now += step
            fut.set_result(None)
            await self.settle()
        step = target - self._mono
        self._mono = target
        self._now += step
        await self.settle()

    def timeout(self, seconds: float | None) -> _FakeTimeout:
        return _FakeTimeout(self, seconds)


class _FakeTimeout:
    """``asyncio.timeout`` equivalent driven by a FakeClock: ``when()`` / ``reschedule()``
    in the clock's monotonic seconds, as ``asyncio.Timeout`` has them in loop time."""

    def __init__(self, clock: FakeClock, seconds: float | None) -> None:
        self._clock, self._seconds = clock, seconds
        self._when: float | None = None
        self._task: asyncio.Task | None = None
        self._watch: asyncio.Task | None = None
        self._fired = False

    async def __aenter__(self) -> _FakeTimeout:
        self._task = asyncio.current_task()
        assert self._task is not None
        if self._seconds is not None:  # <= 0: fires at once, as asyncio.timeout(0) does
            self.reschedule(self._clock.monotonic() + max(0.0, self._seconds))
        return self

    def when(self) -> float | None:
        return self._when

    def reschedule(self, when: float | None) -> None:
        """Fire at clock-monotonic ``when`` instead (None: never)."""
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()
        self._when, self._watch = when, None
        if when is None or self._fired:
            return

        async def watch() -> None:
            await self._clock.sleep(when - self._clock.monotonic())
            self._fired = True
            assert self._task is not None
            self._task.cancel()

        self._watch = asyncio.create_task(watch())

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()
        if self._fired and exc_type is asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.uncancel() == 0:
                raise TimeoutError from exc
        return False


def timeout_time(cm: Any) -> Callable[[], float]:
    """The time base of ``cm.when()`` for a timeout from :meth:`Clock.timeout`: the loop's
    time for ``asyncio.Timeout``, the fake clock's monotonic time for a FakeClock's."""
    if isinstance(cm, _FakeTimeout):
        return cm._clock.monotonic
    return asyncio.get_running_loop().time


SYSTEM_CLOCK = SystemClock()


_iso_cache: list = [None, ""]


def utc_iso(epoch: float) -> str:
    """RFC 3339 UTC with milliseconds, e.g. ``2026-01-01T00:00:00.000Z``."""
    ms = math.floor(epoch * 1000)
    sec, milli = divmod(ms, 1000)
    if _iso_cache[0] != sec:  # the second-resolution prefix is cached: hot path
        dt = datetime.fromtimestamp(sec, tz=UTC)
        _iso_cache[0], _iso_cache[1] = sec, dt.strftime("%Y-%m-%dT%H:%M:%S.")
    return f"{_iso_cache[1]}{milli:03d}Z"


def parse_iso(text: str) -> float:
    """Parse an RFC 3339 / ISO 8601 timestamp into epoch seconds (naive = UTC).

    Raises ValueError on malformed input.
    """
    s = text.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def format_elapsed(seconds: float) -> str:
    """Elapsed time as ``Xs`` / ``Xm Ys`` / ``Xh Ym Zs`` (seed 002 §time awareness)."""
    total = max(0, int(seconds))
    h, rem = divmod(total, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h {m}m {s}s"
    if m:
        return f"{m}m {s}s"
    return f"{s}s"


@asynccontextmanager
async def maybe_timeout(clock: Clock, seconds: float | None) -> AsyncIterator[None]:
    """``clock.timeout`` that treats None/0 as "no limit"."""
    if not seconds:
        yield
        return
    async with clock.timeout(seconds):
        yield


async def sleep_or_wake(clock: Clock, wake: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds`` on ``clock`` or until ``wake`` is set, whichever comes first
    (the event is not cleared). The timers of cron and heartbeat wait this way."""
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    waker = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        waker.cancel()
