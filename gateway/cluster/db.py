"""The replica's PostgreSQL connections (asyncpg): a small pool for statements, one
dedicated connection for ``LISTEN``, and outage tracking for ``status``.

Every statement goes through :meth:`ClusterDB.run`; a lost or refused connection raises
:class:`ClusterUnavailable` and marks the database down (``down_since``, ``last_error``)
until a statement succeeds again. Callers retry on their next tick: replicas ride out a
PostgreSQL restart without a restart of their own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import structlog

log = structlog.get_logger(__name__)

CONNECTION_ERRORS = (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                     asyncpg.CannotConnectNowError, asyncpg.AdminShutdownError,
                     asyncpg.InternalClientError, TimeoutError)
STATEMENT_TIMEOUT = 10.0  # seconds; a hung server counts as an outage


class ClusterUnavailable(RuntimeError):
    """PostgreSQL cannot be reached right now (the message says why)."""


class ClusterDB:
    """Pool + listener for ``dsn``. ``listen(channel, callback)`` before ``open()``;
    the LISTEN connection is re-opened (and its channels re-subscribed) by ``ensure``."""

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 5) -> None:
        self.dsn = dsn
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
        one where it needs it). Raises ClusterUnavailable on connection trouble."""
        await self.ensure()
        assert self.pool is not None
        try:
            async with self.pool.acquire() as conn:
                result = await fn(conn)
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


def _callback(fn: Callable[[str], None]) -> Callable[..., None]:
    def on_notify(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        fn(payload)
    return on_notify
