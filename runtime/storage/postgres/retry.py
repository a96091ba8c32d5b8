"""Riding out a PostgreSQL outage (a restart, a network cut): a write that cannot reach
the server is retried with backoff until a deadline instead of being lost.

The deadline and the pauses run on the store's injectable clock (runtime/clock.py), so
tests drive an outage by advancing a FakeClock and by watching ``RetryStats`` (or the
``<what>_database_unreachable`` warning) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import asyncpg
import structlog

from runtime.clock import SYSTEM_CLOCK, Clock

log = structlog.get_logger(__name__)

T = TypeVar("T")

# The server is not there (restarting, network cut): worth waiting for. Includes
# InternalClientError: a pooled connection whose backend a restart ended, handed out
# before asyncpg saw its socket close (runtime/storage/postgres/pool.py DB_ERRORS).
UNREACHABLE = (OSError, TimeoutError, asyncpg.InterfaceError, asyncpg.InternalClientError,
               asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
               asyncpg.AdminShutdownError)
OUTAGE_RETRY = 20.0  # seconds of the store's clock a write waits for the server
FIRST_DELAY, MAX_DELAY = 0.25, 2.0  # seconds between attempts (doubling)


@dataclass
class RetryStats:
    """What a store's retry loop has done (observable: ``/status`` and tests)."""

    retries: int = 0  # attempts that found the server unreachable and were retried
    outages: int = 0  # retry loops entered (one per write that met an outage)
    gave_up: int = 0  # writes whose deadline passed


async def ride_out(attempt: Callable[[], Awaitable[T]], *, what: str, stats: RetryStats,
                   clock: Clock = SYSTEM_CLOCK, deadline_s: float = OUTAGE_RETRY,
                   recovered: Callable[[], Awaitable[T | None]] | None = None,
                   on_unreachable: Callable[[], None] | None = None, **fields: object) -> T:
    """``await attempt()``, retried while the server is unreachable (:data:`UNREACHABLE`)
    until ``deadline_s`` seconds of ``clock`` have passed; then the last error is raised.
    ``recovered()`` runs before each retry and may return the outcome of an attempt whose
    commit the cut hid (never write twice); None means "not written, try again".
    Logs ``<what>_database_unreachable`` (warning) per retry."""
    deadline = clock.monotonic() + deadline_s
    delay = FIRST_DELAY
    entered = False
    while True:
        try:
            return await attempt()
        except UNREACHABLE as exc:
            if on_unreachable is not None:
                on_unreachable()
            if clock.monotonic() + delay > deadline:
                stats.gave_up += 1
                raise
            if not entered:
                entered = True
                stats.outages += 1
            stats.retries += 1
            log.warning(f"{what}_database_unreachable", error=f"{type(exc).__name__}: {exc}",
                        retry_in_s=delay, **fields)
        await clock.sleep(delay)
        delay = min(delay * 2, MAX_DELAY)
        if recovered is not None:
            try:
                done = await recovered()
            except UNREACHABLE:
                done = None
            if done is not None:
                return done


def ride_out_blocking(attempt: Callable[[], T], *, what: str, stats: RetryStats,
                      deadline_s: float = OUTAGE_RETRY, **fields: object) -> T:
    """:func:`ride_out` for a blocking ``attempt()`` in a worker thread (a read through
    the bridge: a turn's transcript preload, a resumed turn's look-up), paced in real
    seconds. Called on a thread that runs an event loop it raises at once instead: a
    wait there would stall every session."""
    on_loop = asyncio._get_running_loop() is not None
    deadline = time.monotonic() + deadline_s
    delay = FIRST_DELAY
    while True:
        try:
            return attempt()
        except UNREACHABLE as exc:
            if on_loop:
                raise
            if time.monotonic() + delay > deadline:
                stats.gave_up += 1
                raise
            stats.retries += 1
            log.warning(f"{what}_database_unreachable", error=f"{type(exc).__name__}: {exc}",
                        retry_in_s=delay, **fields)
        threading.Event().wait(delay)
        delay = min(delay * 2, MAX_DELAY)
