"""The PostgreSQL :class:`runtime.storage.documents.DocumentRecords` backend: one row of
``state_documents`` (``migrations/0013_state_documents.sql``) per document name.

``write`` returns at once (``write_behind``): the bridge's loop upserts the newest
bytes, retrying while PostgreSQL is unreachable; a newer write replaces a waiting one.
``update`` is the merge for a document several replicas change (the auth profile state):
its changes are applied in order to the stored bytes under the row lock, in one
transaction, so two replicas' changes both land instead of the last write winning.
A corrupt document is copied to the row ``<name>.corrupt-<UTC stamp>``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import asyncpg
import structlog

from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import DB_ERRORS as _DB_ERRORS
from runtime.storage.postgres.pool import redact_dsn
from runtime.storage.postgres.write_behind import WriteBehind

log = structlog.get_logger(__name__)

READ_TIMEOUT = 5.0  # seconds: callers on the event loop get an OSError, not a hang
_UPSERT = ("INSERT INTO state_documents (name, body) VALUES ($1, $2) ON CONFLICT (name) "
           "DO UPDATE SET body = EXCLUDED.body, updated_at = now()")
# The same, only while the account lease is held with the writer's generation (fencing,
# migration 0101): a replica that lost the lease never overwrites the new owner's bytes.
_FENCED_UPSERT = ("INSERT INTO state_documents (name, body) SELECT $1, $2 WHERE EXISTS ("
                  "SELECT 1 FROM cluster_leases WHERE name = $3 AND replica_id = $4 AND "
                  "generation = $5 FOR SHARE) ON CONFLICT (name) DO UPDATE SET body = "
                  "EXCLUDED.body, updated_at = now() RETURNING true")


class PgDocument:
    """Document ``name`` in PostgreSQL through a shared :class:`SyncBridge`. ``shared``:
    other replicas write it too (an owner may merge their changes before its own)."""

    shared = True

    def __init__(self, bridge: SyncBridge, name: str) -> None:
        self.bridge, self.name = bridge, name
        self.path = f"postgresql state_documents[{name}] ({redact_dsn(bridge.dsn)})"
        self._pending: bytes | None = None
        self._fence: tuple[str, str, int] | None = None
        self.fenced = 0  # writes the fence refused
        self._spool = WriteBehind(bridge, self.path, take=self._take, restore=self._restore,
                                  write=self._upsert)
        self._changes: list[Callable[[bytes | None], bytes]] = []
        self._merges = WriteBehind(bridge, self.path, take=self._take_changes,
                                   restore=self._restore_changes, write=self._merge)
        self._merged: tuple[int, bytes] | None = None  # (merges so far, stored bytes)
        self._queued = 0  # changes not yet committed
        self._count_lock = threading.Lock()  # _queued is counted on both threads

    def update(self, change: Callable[[bytes | None], bytes]) -> None:
        """Queue ``change(stored bytes or None) -> new bytes``; returns at once. The
        bridge applies the queued changes in order to the row it has locked and commits
        (retried through an outage). ``change`` must not raise."""
        with self._count_lock:
            self._queued += 1
        self._merges.submit(lambda: self._changes.append(change))

    def merged(self) -> tuple[int, bytes] | None:
        """``(n, bytes)``: the document as the n-th merge committed it (other replicas'
        changes included), once every change queued here is in; else None."""
        with self._count_lock:
            return self._merged if self._queued == 0 else None

    def _take_changes(self) -> list[Callable[[bytes | None], bytes]] | None:
        changes, self._changes = self._changes, []
        return changes or None

    def _restore_changes(self, changes: list[Callable[[bytes | None], bytes]]) -> None:
        self._changes[:0] = changes

    async def _merge(self, conn: asyncpg.Connection,
                     changes: list[Callable[[bytes | None], bytes]]) -> None:
        async with conn.transaction():
            # a placeholder row to lock when there is none; replaced before COMMIT
            await conn.execute("INSERT INTO state_documents (name, body) VALUES ($1, '') "
                               "ON CONFLICT (name) DO NOTHING", self.name)
            body = await conn.fetchval("SELECT body FROM state_documents WHERE name = $1 "
                                       "FOR UPDATE", self.name)
            data = bytes(body) or None
            for change in changes:
                data = change(data)
            await conn.execute("UPDATE state_documents SET body = $2, updated_at = now() "
                               "WHERE name = $1", self.name, data)
        with self._count_lock:
            self._merged = ((self._merged[0] if self._merged else 0) + 1, data)
            self._queued -= len(changes)

    def fence(self, lease: str, replica: str, generation: int) -> None:
        """Write only while ``replica`` holds lease ``lease`` with ``generation``; a
        refused write is dropped and logged (``state_document_fenced``)."""
        self._fence = (lease, replica, generation)

    async def _upsert(self, conn: asyncpg.Connection, data: bytes) -> None:
        fence = self._fence
        if fence is None:
            await conn.execute(_UPSERT, self.name, data)
        elif not await conn.fetchval(_FENCED_UPSERT, self.name, data, *fence):
            self.fenced += 1
            log.warning("state_document_fenced", name=self.name, lease=fence[0],
                        replica=fence[1], generation=fence[2],
                        reason="the lease is no longer this replica's")

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
        """Block until the queued writes and merges landed (tests, shutdown)."""
        self._spool.wait(timeout)
        self._merges.wait(timeout)

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
