"""The PostgreSQL :class:`runtime.storage.outbox.OutboxRecords` backend: table ``outbox``
(``migrations/0011_outbox.sql``). Each row names its ``owner``, the replica that retries
it: at start a replica loads its own rows and adopts those of owners with no live
heartbeat row in ``cluster_replicas`` (older than ``ttl`` seconds or stopped), in one
statement with ``FOR UPDATE SKIP LOCKED``, so two replicas never both deliver an entry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import asyncpg

from runtime.storage.outbox import Unreadable
from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import DB_ERRORS as _DB_ERRORS
from runtime.storage.postgres.pool import redact_dsn

T = TypeVar("T")
_ADOPT = """
UPDATE outbox SET owner = $1, updated_at = now() WHERE id IN (
    SELECT o.id FROM outbox o WHERE NOT o.dead AND o.owner <> $1 AND NOT EXISTS (
        SELECT 1 FROM cluster_replicas r WHERE r.id = o.owner AND r.stopped_at IS NULL
        AND r.heartbeat_at > now() - make_interval(secs => $2))
    FOR UPDATE SKIP LOCKED)
RETURNING id, entry"""


class PgOutboxRecords:
    """Replica ``owner``'s outbox rows through a shared :class:`SyncBridge`."""

    remote = True  # written off the event loop (channels.outbound.outbox)

    def __init__(self, bridge: SyncBridge, owner: str, ttl: float = 15.0) -> None:
        self.bridge, self.owner, self.ttl = bridge, owner, float(ttl)
        self.path = f"postgresql outbox ({redact_dsn(bridge.dsn)})"

    def _call(self, fn: Callable[[asyncpg.Connection], Any], what: str) -> Any:
        try:
            return self.bridge.call(fn, timeout=30.0)
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: {what} failed ({type(exc).__name__}: {exc})") from None

    def _parse_rows(self, rows: list[Any], parse: Callable[[dict[str, Any]], T]
                    ) -> tuple[list[T], list[Unreadable]]:
        out: list[T] = []
        bad: list[Unreadable] = []
        for entry_id, text in rows:
            try:
                out.append(parse(json.loads(text)))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                # dead-lettered as is: the bytes stay in the row for the operator
                self._call(lambda c, i=entry_id: c.execute(
                    "UPDATE outbox SET dead = true WHERE id = $1", i), "quarantine")
                bad.append(Unreadable(f"{self.path} id {entry_id}",
                                      f"{type(e).__name__}: {e}", "its row, marked dead"))
        return out, bad

    def load(self, parse: Callable[[dict[str, Any]], T]) -> tuple[list[T], list[Unreadable]]:
        async def fetch(conn: asyncpg.Connection) -> list[Any]:
            own = await conn.fetch("SELECT id, entry FROM outbox WHERE owner = $1 AND "
                                   "NOT dead ORDER BY id", self.owner)
            return [tuple(r) for r in own] + [tuple(r) for r in
                                              await conn.fetch(_ADOPT, self.owner, self.ttl)]
        return self._parse_rows(self._call(fetch, "load"), parse)

    def adopt(self, parse: Callable[[dict[str, Any]], T]) -> list[T]:
        rows = self._call(lambda c: c.fetch(_ADOPT, self.owner, self.ttl), "adopt")
        return self._parse_rows([tuple(r) for r in rows], parse)[0]

    def peek(self) -> list[dict[str, Any]]:
        """Every pending entry of every replica, claiming nothing (``doctor``)."""
        rows = self._call(lambda c: c.fetch("SELECT entry FROM outbox WHERE NOT dead"),
                          "read")
        return [json.loads(r[0]) for r in rows]

    def save(self, entry: dict[str, Any]) -> None:
        text = json.dumps(entry, ensure_ascii=False)
        self._call(lambda c: c.execute(
            "INSERT INTO outbox (id, owner, entry) VALUES ($1, $2, $3) ON CONFLICT (id) DO "
            "UPDATE SET entry = EXCLUDED.entry, owner = EXCLUDED.owner, updated_at = now()",
            entry["id"], self.owner, text), "save")

    def delete(self, entry_id: str) -> None:
        self._call(lambda c: c.execute("DELETE FROM outbox WHERE id = $1 AND NOT dead",
                                       entry_id), "delete")

    def bury(self, entry: dict[str, Any]) -> None:
        text = json.dumps(entry, ensure_ascii=False)
        self._call(lambda c: c.execute(
            "INSERT INTO outbox (id, owner, entry, dead) VALUES ($1, $2, $3, true) ON "
            "CONFLICT (id) DO UPDATE SET entry = EXCLUDED.entry, dead = true, "
            "updated_at = now()", entry["id"], self.owner, text), "dead letter")
