"""Waiting for PostgreSQL at start: a gateway started while its database is down (a
reboot where PostgreSQL comes up later, a database restart) keeps trying instead of
exiting, so a service manager's start limit is never what keeps it down.

Each attempt is :func:`runtime.storage.postgres.pool.open_database` (a connect that hangs
gives up after ``storage.pool.connect_timeout``); a transient failure (refused, timed
out, starting up, too many connections) is retried after a delay that doubles from 0.5 s
up to 15 s, for as long as it takes; anything else (a refused login, a missing
database, a failing migration) raises at once. While it waits, ``on_wait`` gets the
state (``{"waiting_for": "PostgreSQL", "since", "attempts", "last_error",
"retry_in_s"}``) for ``status`` and the service manager.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.storage.postgres.errors import StartAborted, StorageUnavailable

if TYPE_CHECKING:
    import asyncpg

    from runtime.storage.config import StorageSection

log = structlog.get_logger(__name__)

FIRST_DELAY = 0.5  # seconds before the second attempt
MAX_DELAY = 15.0  # seconds between attempts at most


async def open_database_waiting(section: StorageSection, *, clock: Clock = SYSTEM_CLOCK,
                                on_wait: Callable[[dict[str, Any] | None], None] | None = None,
                                stop: asyncio.Event | None = None) -> asyncpg.Pool:
    """The migrated pool, once PostgreSQL answers. ``on_wait(state)`` after each failed
    attempt and ``on_wait(None)`` once connected (only if it waited). Raises
    StorageUnavailable (not transient), MigrationError, or StartAborted when ``stop`` is
    set while waiting."""
    from runtime.storage.postgres.pool import open_database
    delay, attempts, since = FIRST_DELAY, 0, clock.time()
    while True:
        attempts += 1
        try:
            pool = await open_database(section)
        except StorageUnavailable as exc:
            if not exc.transient:
                raise
            state = {"waiting_for": "PostgreSQL", "since": since, "attempts": attempts,
                     "last_error": str(exc), "retry_in_s": delay}
            log.warning("storage_waiting_for_postgres", attempts=attempts,
                        waited_s=round(clock.time() - since, 1), retry_in_s=delay,
                        error=str(exc))
            if on_wait is not None:
                on_wait(state)
            if await _stopped(clock, delay, stop):
                raise StartAborted("stopped while waiting for PostgreSQL "
                                   f"({attempts} attempts): {exc}") from None
            delay = min(MAX_DELAY, delay * 2)
            continue
        if attempts > 1:
            log.info("storage_postgres_reached", attempts=attempts,
                     waited_s=round(clock.time() - since, 1))
            if on_wait is not None:
                on_wait(None)
        return pool


async def _stopped(clock: Clock, delay: float, stop: asyncio.Event | None) -> bool:
    """Sleep ``delay`` seconds on ``clock``; True when ``stop`` was set meanwhile."""
    if stop is None:
        await clock.sleep(delay)
        return False
    sleeper = asyncio.ensure_future(clock.sleep(delay))
    waiter = asyncio.ensure_future(stop.wait())
    await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
    for task in (sleeper, waiter):
        task.cancel()
    return stop.is_set()
