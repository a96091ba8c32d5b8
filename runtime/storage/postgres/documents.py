"""The PostgreSQL :class:`runtime.storage.documents.DocumentRecords` backend: one row of
``state_documents`` (``migrations/0013_state_documents.sql``) per document name.

``write`` returns at once (``write_behind``): the bridge's loop upserts the newest
bytes, retrying while PostgreSQL is unreachable; a newer write replaces a waiting one.
A corrupt document is copied to the row ``<name>.corrupt-<UTC stamp>``.
"""

from __future__ import annotations

import time

import asyncpg
import structlog

from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import redact_dsn
from runtime.storage.postgres.write_behind import WriteBehind

log = structlog.get_logger(__name__)

_DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)
READ_TIMEOUT = 5.0  # seconds: callers on the event loop get an OSError, not a hang
_UPSERT = ("INSERT INTO state_documents (name, body) VALUES ($1, $2) ON CONFLICT (name) "
           "DO UPDATE SET body = EXCLUDED.body, updated_at = now()")


class PgDocument:
    """Document ``name`` in PostgreSQL through a shared :class:`SyncBridge`. ``shared``:
    other replicas write it too (an owner may merge their changes before its own)."""

    shared = True

    def __init__(self, bridge: SyncBridge, name: str) -> None:
        self.bridge, self.name = bridge, name
        self.path = f"postgresql state_documents[{name}] ({redact_dsn(bridge.dsn)})"
        self._pending: bytes | None = None
        self._spool = WriteBehind(bridge, self.path, take=self._take, restore=self._restore,
                                  write=lambda c, data: c.execute(_UPSERT, name, data))

    def _take(self) -> bytes | None:
        data, self._pending = self._pending, None
        return data

    def _restore(self, data: bytes) -> None:
        if self._pending is None:
            self._pending = data  # nothing newer: this one again

    def read(self) -> bytes | None:
        try:
            body = self.bridge.call(lambda c: c.fetchval(
                "SELECT body FROM state_documents WHERE name = $1", self.name),
                timeout=READ_TIMEOUT)
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: read failed ({type(exc).__name__}: {exc})") from None
        return bytes(body) if body is not None else None

    def write(self, data: bytes) -> None:
        def change() -> None:
            self._pending = data
        self._spool.submit(change)

    def wait_written(self, timeout: float = 30.0) -> None:
        """Block until the queued write landed (tests, shutdown)."""
        self._spool.wait(timeout)

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
