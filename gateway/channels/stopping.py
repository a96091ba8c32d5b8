"""Stopping the channel adapters at shutdown within a bound (``gateway.channel_stop_timeout``).

A plugin's ``stop()`` may never return: a ``close()`` waiting on a dead connection, a
receive loop that swallows its cancellation (``except BaseException: pass``) and is
awaited, a file read blocked in a thread. None of them may keep the gateway from exiting
after SIGTERM: :func:`stop_channels` runs every ``stop()`` as its own task, all side by
side, waits at most ``timeout`` seconds of the gateway clock, then cancels what is still
running and gives it :data:`CANCEL_WAIT` more to unwind. A stop still running after that
ignored its cancellation: it is left behind (logged ``channel_stop_abandoned``, naming the
channel) and the process exits without it (gateway/service/exit.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from runtime.clock import Clock

log = structlog.get_logger(__name__)

CANCEL_WAIT = 1.0  # s a cancelled stop() may take to unwind before it is left behind
TASK_PREFIX = "channel-stop:"  # names of the stop tasks (the exit report names them)


# adapters whose stop was left behind (id -> (adapter, its stop task)): a second stop
# (the cluster's, after the gateway's) does not wait for them again
_LEFT_BEHIND: dict[int, tuple[Any, asyncio.Task]] = {}


def _still_stopping(ch: Any) -> bool:
    entry = _LEFT_BEHIND.get(id(ch))
    return entry is not None and entry[0] is ch and not entry[1].done()


def channel_label(ch: Any) -> str:
    """``name:account`` of an adapter (``name`` alone for the default account)."""
    account = getattr(ch, "account_id", "default") or "default"
    return ch.name if account == "default" else f"{ch.name}:{account}"


async def _wait(tasks: set[asyncio.Task], seconds: float, clock: Clock) -> None:
    """Until every task is done or ``seconds`` of ``clock`` have passed."""
    if not tasks:
        return
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({*tasks, timer}, return_when=asyncio.FIRST_COMPLETED)
        while not timer.done() and not all(t.done() for t in tasks):
            await asyncio.wait({*[t for t in tasks if not t.done()], timer},
                               return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()


def _outcome(ch: Any, task: asyncio.Task) -> None:
    if task.cancelled():
        return
    exc = task.exception()  # retrieved: no "exception was never retrieved" at exit
    if exc is not None:
        log.error("channel_stop_failed", channel=ch.name, account=ch.account_id,
                  error=f"{type(exc).__name__}: {exc}", exc_info=exc)


async def stop_channels(channels: list[Any], *, timeout: float,
                        clock: Clock) -> list[str]:
    """``await ch.stop()`` for every channel concurrently, bounded as the module says.

    Returns the labels (``name`` or ``name:account``) of the channels whose stop was left
    behind because it ignored its cancellation (``[]``: every stop finished or unwound).
    Logs ``channel_stop_timed_out`` (error) for a stop that took longer than ``timeout``
    and ``channel_stop_abandoned`` (warning) for one left behind. Never raises."""
    left = [channel_label(ch) for ch in channels if _still_stopping(ch)]
    tasks = {asyncio.ensure_future(ch.stop()): ch for ch in channels
             if not _still_stopping(ch)}
    for task, ch in tasks.items():
        task.set_name(TASK_PREFIX + channel_label(ch))
        _LEFT_BEHIND.pop(id(ch), None)
    await _wait(set(tasks), timeout, clock)
    late = {t: ch for t, ch in tasks.items() if not t.done()}
    for task, ch in late.items():
        log.error("channel_stop_timed_out", channel=ch.name, account=ch.account_id,
                  timeout_s=timeout)
        task.cancel()
    await _wait(set(late), CANCEL_WAIT, clock)
    abandoned = left
    for task, ch in tasks.items():
        if task.done():
            _outcome(ch, task)
            continue
        abandoned.append(channel_label(ch))
        _LEFT_BEHIND[id(ch)] = (ch, task)
        log.warning("channel_stop_abandoned", channel=ch.name, account=ch.account_id,
                    timeout_s=timeout, reason="its stop() ignored the cancellation",
                    effect="the gateway exits without waiting for it")
    return abandoned
