"""Starting one channel adapter with a time limit (``gateway.channel_start_timeout``).

An adapter's ``start`` (a plugin's ``open``) that never returns — a connect to a
black-holed host without a timeout — must not hold the gateway: :func:`start_channel`
gives it ``timeout`` seconds on the gateway clock, then cancels it. A start that raises,
times out or is cut short by a stop (SIGTERM during start-up) leaves that channel
``failed`` with its ``last_error``, which ``status`` and ``/readyz`` show; the other
channels are started concurrently by the caller and are not affected.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from runtime.clock import Clock

log = structlog.get_logger(__name__)

CANCEL_WAIT = 2.0  # seconds a cancelled start may take to unwind before it is left behind


def mark_failed(ch: Any, error: str) -> None:
    """Put ``ch`` in state ``failed`` with ``last_error`` = ``error`` (``set_state`` of a
    ``ChannelAdapter``, else the attributes themselves)."""
    set_state = getattr(ch, "set_state", None)
    if callable(set_state):
        set_state("failed", error)
        return
    ch.state = "failed"
    ch.last_error = error


def _error_text(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    # bounded: an open() that swallows the cancellation is left behind, not waited for
    await asyncio.wait({task}, timeout=CANCEL_WAIT)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: no "exception was never retrieved" at exit


async def start_channel(ch: Any, on_message: Any, on_event: Any, *, timeout: float,
                        clock: Clock, abort: asyncio.Event | None = None) -> str | None:
    """``await ch.start(on_message, on_event)`` for at most ``timeout`` seconds of
    ``clock`` (or until ``abort`` is set). Returns None when the start returned, else the
    error (``"ConnectionError: ..."``, ``"start timed out after 30s"``, ``"start
    cancelled: the gateway is stopping"``), after marking the channel failed and
    cancelling a start still running. Never raises (except CancelledError)."""
    task = asyncio.ensure_future(ch.start(on_message, on_event))
    waiters: set[asyncio.Future] = {task}
    timer = asyncio.ensure_future(clock.sleep(timeout))
    waiters.add(timer)
    stopper = asyncio.ensure_future(abort.wait()) if abort is not None else None
    if stopper is not None:
        waiters.add(stopper)
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        timed_out = timer.done() and not task.done()
    except asyncio.CancelledError:
        await _cancel(task)
        raise
    finally:
        for w in (timer, stopper):
            if w is not None:
                w.cancel()
    if task.done():
        if task.cancelled():
            error = "start cancelled"
        elif task.exception() is None:
            return None
        else:
            error = _error_text(task.exception())
    else:
        await _cancel(task)
        error = (f"start timed out after {timeout:g}s" if timed_out
                 else "start cancelled: the gateway is stopping")
    mark_failed(ch, error)
    return error
