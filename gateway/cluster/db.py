"""The replica's PostgreSQL connections (asyncpg): a small pool for statements, one
dedicated connection for ``LISTEN``, and outage tracking for ``status``.

Every statement goes through :meth:`ClusterDB.run`; a lost or refused connection raises
:class:`ClusterUnavailable` and marks the database down (``down_since``, ``last_error``)
until a statement succeeds again. Callers retry on their next tick: replicas ride out a
PostgreSQL restart without a restart of their own.

An outage is not a death: while the database is down no replica can write its heartbeat,
so right after it every heartbeat looks older than the lease TTL. For one TTL after this
replica got through again, :meth:`ClusterDB.peer_ttl` presumes nobody dead (the others are
reconnecting too); only a replica that stays silent for a TTL while the database answers
here is taken over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import structlog

from runtime.clock import Clock, SystemClock

log = structlog.get_logger(__name__)

CONNECTION_ERRORS = (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                     asyncpg.CannotConnectNowError, asyncpg.AdminShutdownError,
                     asyncpg.InternalClientError, TimeoutError)
STATEMENT_TIMEOUT = 10.0  # seconds; a hung server counts as an outage
# Two transactions locking rows and leases in crossed order (a takeover and a routing
# on two replicas): PostgreSQL aborts one; it is run again.
TRANSIENT_ERRORS = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)
TRANSIENT_TRIES = 3
NOBODY_DEAD = 1e9  # seconds: a TTL no heartbeat is older than (see peer_ttl)


class ClusterUnavailable(RuntimeError):
    """PostgreSQL cannot be reached right now (the message says why)."""


class ClusterDB:
    """Pool + listener for ``dsn``. ``listen(channel, callback)`` before ``open()``;
    the LISTEN connection is re-opened (and its channels re-subscribed) by ``ensure``."""

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 5,
                 clock: Clock | None = None) -> None:
        self.dsn = dsn
        self.clock = clock or SystemClock()
        self.back_at: float | None = None  # clock.monotonic() when the last outage ended
        self.min_size, self.max_size = min_size, max_size
        self.pool: asyncpg.Pool | None = None
        self._listener: asyncpg.Connection | None = None
        self._channels: dict[str, Callable[[str], None]] = {}
        self.down_since: float | None = None  # epoch seconds (wall clock)
        self.last_error: str | None = None
        self.outages = 0

    def listen(self, channel: str, callback: Callable[[str], None]) -> None:
        self._channels[channel] = callback

    async def ensure(self) -> None:
        """Open the pool and the LISTEN connection if they are not open (raises
        ClusterUnavailable)."""
        try:
            if self.pool is None:
                self.pool = await asyncpg.create_pool(
                    self.dsn, min_size=self.min_size, max_size=self.max_size,
                    command_timeout=STATEMENT_TIMEOUT, timeout=STATEMENT_TIMEOUT)
            if self._channels and (self._listener is None or self._listener.is_closed()):
                conn = await asyncpg.connect(self.dsn, timeout=STATEMENT_TIMEOUT)
                for channel, callback in self._channels.items():
                    await conn.add_listener(channel, _callback(callback))
                self._listener = conn
        except CONNECTION_ERRORS as exc:
            self._down(exc)
            raise ClusterUnavailable(self.last_error) from exc
        self._up()

    async def run(self, fn: Callable[[asyncpg.Connection], Awaitable[Any]]) -> Any:
        """``await fn(conn)`` on a pooled connection (inside no transaction: ``fn`` opens
        one where it needs it). Raises ClusterUnavailable on connection trouble; a
        deadlock or serialization failure runs ``fn`` again (up to 3 times)."""
        await self.ensure()
        assert self.pool is not None
        for attempt in range(1, TRANSIENT_TRIES + 1):
            try:
                async with self.pool.acquire() as conn:
                    result = await fn(conn)
                break
            except TRANSIENT_ERRORS as exc:  # rolled back: nothing was written
                if attempt == TRANSIENT_TRIES:
                    raise
                log.info("cluster_statement_retried", error=type(exc).__name__,
                         attempt=attempt)
            except CONNECTION_ERRORS as exc:
                self._down(exc)
                raise ClusterUnavailable(self.last_error) from exc
        self._up()
        return result

    async def retry(self, fn: Callable[[asyncpg.Connection], Awaitable[Any]], *,
                    what: str, delay: float = 0.5, max_delay: float = 5.0) -> Any:
        """:meth:`run` until it succeeds (used where giving up would lose work: intake,
        cron claims); waits with doubling ``delay`` between attempts."""
        while True:
            try:
                return await self.run(fn)
            except ClusterUnavailable:
                log.info("cluster_waiting_for_postgres", what=what, retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(max_delay, delay * 2)

    async def close(self) -> None:
        if self._listener is not None:
            try:
                await asyncio.wait_for(self._listener.close(), 2.0)
            except Exception:  # noqa: BLE001 - closing a dead connection
                self._listener.terminate()
            self._listener = None
        if self.pool is not None:
            try:
                await asyncio.wait_for(self.pool.close(), 5.0)
            except Exception:  # noqa: BLE001
                self.pool.terminate()
            self.pool = None

    def peer_ttl(self, ttl: float) -> float:
        """The lease TTL (seconds) to judge other replicas dead by: ``ttl``, except for
        ``ttl`` seconds after an outage ended here, when it is :data:`NOBODY_DEAD` (their
        heartbeats are stale because nobody could write one; they reconnect meanwhile)."""
        if self.back_at is not None and self.clock.monotonic() - self.back_at < ttl:
            return NOBODY_DEAD
        return ttl

    def status(self) -> dict[str, Any]:
        return {"state": "down" if self.down_since is not None else "up",
                "down_since": self.down_since,
                "down_for_s": round(time.time() - self.down_since, 1)
                if self.down_since is not None else None,
                "last_error": self.last_error, "outages": self.outages}

    def _down(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        if self.down_since is None:
            self.down_since = time.time()
            self.outages += 1
            log.error("cluster_postgres_down", error=self.last_error)
        if self._listener is not None and self._listener.is_closed():
            self._listener = None

    def _up(self) -> None:
        if self.down_since is not None:
            log.info("cluster_postgres_up", down_for_s=round(time.time() - self.down_since, 1))
            self.down_since = None
            self.back_at = self.clock.monotonic()


def _callback(fn: Callable[[str], None]) -> Callable[..., None]:
    def on_notify(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        fn(payload)
    return on_notify
