"""Writes that must not make the event loop wait for PostgreSQL (the usage ledger, small
state documents): the caller changes its pending state and returns; the bridge's loop
takes what is pending, writes it and, while PostgreSQL is unreachable, retries with
backoff (1 s doubling to 30 s). Nothing queued is lost while the process lives: a write
that fails in any other way is retried the same way (logged as an error), so no single
failure ends the writer and with it every later write of the store."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import structlog

from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import DB_ERRORS as _DB_ERRORS

log = structlog.get_logger(__name__)


class WriteBehind:
    """``take()`` -> the pending item or None, ``restore(item)`` after a failed write
    (both called under the lock), ``write(conn, item)`` the statement."""

    def __init__(self, bridge: SyncBridge, what: str, *, take: Callable[[], Any],
                 restore: Callable[[Any], None],
                 write: Callable[[asyncpg.Connection, Any], Awaitable[Any]]) -> None:
        self.bridge, self.what = bridge, what
        self._take, self._restore, self._write = take, restore, write
        self._lock = threading.Lock()  # the pending state is shared with the bridge thread
        self._running = False
        self.writer: Any = None  # the concurrent future of the running flush

    def submit(self, change: Callable[[], None]) -> None:
        """Apply ``change`` to the pending state and make sure a flush runs."""
        with self._lock:
            change()
            if self._running:
                return
            self._running = True
        self.writer = self.bridge.spawn(self._flush)

    async def _flush(self, run: Any) -> None:
        delay = 1.0
        while True:
            with self._lock:
                item = self._take()
                if item is None:
                    self._running = False
                    return
            try:
                await run(lambda c, item=item: self._write(c, item))
                delay = 1.0
            except Exception as exc:  # noqa: BLE001 - the writer must outlive any failure
                with self._lock:
                    self._restore(item)
                (log.warning if isinstance(exc, _DB_ERRORS) else log.error)(
                    "storage_write_retry", store=self.what, retry_in_s=delay,
                    error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(delay)
                delay = min(30.0, delay * 2)

    def wait(self, timeout: float) -> None:
        """Block until what was submitted has been written (TimeoutError otherwise)."""
        if self.writer is not None:
            self.writer.result(timeout)
