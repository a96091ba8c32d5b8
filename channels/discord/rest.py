"""Every discord.py REST call runs in a task of its own, so a caller's timeout or
cancellation never interrupts discord.py mid-request.

Why: discord.py's per-route rate-limit bucket (``discord.http.Ratelimit``, 2.x) hands
its token back in ``__aexit__`` after an ``await``; a cancel that lands there leaves the
bucket empty, and every later request on that route (``POST /users/@me/channels`` for
DMs, say) waits 30 s in ``acquire`` — longer than our send timeout, so the route stays
blocked for the life of the client. A cosmetic typing call cancelled at the end of a turn
did exactly that. With ``shielded`` the caller stops waiting, the request itself finishes
(bounded by discord.py's HTTP session timeout) and the bucket is refilled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import structlog

T = TypeVar("T")
log = structlog.get_logger(__name__)
_inflight: set[asyncio.Future] = set()  # strong references until each call finishes


def _finished(task: asyncio.Future) -> None:
    _inflight.discard(task)
    if not task.cancelled() and task.exception() is not None:
        # Retrieved here so an abandoned call never warns "exception never retrieved";
        # the caller that was still waiting got the same exception.
        log.debug("discord_rest_failed", error=f"{type(task.exception()).__name__}")


async def shielded(call: Awaitable[T]) -> T:
    """Await ``call`` (a discord.py coroutine) in its own task; cancelling the caller (a
    timeout, a stopped typing indicator) leaves the request running to completion.
    Returns what ``call`` returns; raises what it raises."""
    task = asyncio.ensure_future(call)
    _inflight.add(task)
    task.add_done_callback(_finished)
    return await asyncio.shield(task)
