"""The PostgreSQL :class:`runtime.storage.documents.DocumentRecords` backend: one row of
``state_documents`` (``migrations/0013_state_documents.sql``) per document name.

``write`` returns at once: the newest bytes are handed to the bridge's loop, which
upserts them and, while PostgreSQL is unreachable, retries with backoff (1 s doubling to
30 s); a newer write replaces a waiting one. A corrupt document is copied to the row
``<name>.corrupt-<UTC stamp>``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import asyncpg
import structlog

from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import redact_dsn

log = structlog.get_logger(__name__)

_DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)
_UPSERT = ("INSERT INTO state_documents (name, body) VALUES ($1, $2) ON CONFLICT (name) "
           "DO UPDATE SET body = EXCLUDED.body, updated_at = now()")


class PgDocument:
    """Document ``name`` in PostgreSQL through a shared :class:`SyncBridge`."""

    def __init__(self, bridge: SyncBridge, name: str) -> None:
        self.bridge, self.name = bridge, name
        self.path = f"postgresql state_documents[{name}] ({redact_dsn(bridge.dsn)})"
        self._pending: bytes | None = None
        self._lock = threading.Lock()  # _pending is shared with the bridge's thread
        self._running = False
        self._writer: Any = None

    def read(self) -> bytes | None:
        try:
            body = self.bridge.call(lambda c: c.fetchval(
                "SELECT body FROM state_documents WHERE name = $1", self.name))
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: read failed ({type(exc).__name__}: {exc})") from None
        return bytes(body) if body is not None else None

    def write(self, data: bytes) -> None:
        with self._lock:
            self._pending = data
            if self._running:
                return
            self._running = True
        self._writer = self.bridge.spawn(self._flush)

    async def _flush(self, run: Any) -> None:
        delay = 1.0
        while True:
            with self._lock:
                if self._pending is None:
                    self._running = False
                    return
                data, self._pending = self._pending, None
            try:
                await run(lambda c: c.execute(_UPSERT, self.name, data))
                delay = 1.0
            except _DB_ERRORS as exc:
                with self._lock:
                    if self._pending is None:
                        self._pending = data  # nothing newer: this one again
                log.warning("state_document_write_retry", name=self.name, error=str(exc),
                            retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(30.0, delay * 2)

    def wait_written(self, timeout: float = 30.0) -> None:
        """Block until the queued write landed (tests, shutdown)."""
        if self._writer is not None:
            self._writer.result(timeout)

    def keep_aside(self) -> str | None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = f"{self.name}.corrupt-{stamp}"
        try:
            self.bridge.call(lambda c: c.execute(
                "INSERT INTO state_documents (name, body) SELECT $2, body FROM "
                "state_documents WHERE name = $1 ON CONFLICT (name) DO NOTHING",
                self.name, aside))
        except _DB_ERRORS as exc:
            log.error("state_document_keep_aside_failed", name=self.name, error=str(exc))
            return None
        return aside
