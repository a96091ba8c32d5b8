"""The turn timeout, paused while a person decides.

A turn is bounded by ``agents.*.timeout`` (runtime/turn/runner.py). Waiting for an exec
approval is not the agent's time: an approver who answers after four minutes must not find
that the turn timed out meanwhile. The runner publishes its timeout context manager here;
``paused()`` lifts the deadline for the wait and, when the wait ends, sets it to the time
that was left when it began. Nested and parallel pauses (two tool calls waiting at once)
count once: the deadline comes back when the last one ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from runtime.clock import timeout_time


@dataclass(slots=True)
class _Deadline:
    cm: Any  # asyncio.Timeout or runtime.clock._FakeTimeout (when/reschedule)
    now: Any  # () -> seconds on the timeout's own time base
    depth: int = 0
    left: float | None = None


_current: ContextVar[_Deadline | None] = ContextVar("tidegate_turn_deadline", default=None)


@contextlib.contextmanager
def published(cm: Any) -> Iterator[None]:
    """Used by the runner inside its ``async with clock.timeout(...) as cm``: tool calls
    of the turn (its task and the tasks it starts) can pause ``cm``."""
    token = _current.set(_Deadline(cm, timeout_time(cm)))
    try:
        yield
    finally:
        _current.reset(token)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Suspend the current turn's deadline for the block (no-op outside a turn or when the
    turn has no timeout)."""
    d = _current.get()
    if d is None or (d.depth == 0 and d.cm.when() is None):
        yield
        return
    if d.depth == 0:
        d.left = max(0.0, d.cm.when() - d.now())
        d.cm.reschedule(None)
    d.depth += 1
    try:
        yield
    finally:
        d.depth -= 1
        if d.depth == 0 and d.left is not None:
            d.cm.reschedule(d.now() + d.left)
            d.left = None
