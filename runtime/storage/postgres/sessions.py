"""The PostgreSQL :class:`runtime.storage.sessions.SessionRecords` backend: table
``sessions`` (``migrations/0001_sessions.sql``), one row per (agent, session key), the
entry as jsonb. Like the SQLite backend it writes only the changed rows, in one
transaction (upsert + delete), so a change costs the same whatever the number of sessions.

Replicas: ``write_fenced`` writes each row only while the session's lane lease still has
the holder and generation the change was made under (``fence.py``), in the same
statement, and names the rows it refused; ``load_one`` re-reads a session whose lane this
replica just took over.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.fence import Fence, holds
from runtime.storage.postgres.pool import DB_ERRORS as _DB_ERRORS
from runtime.storage.postgres.pool import redact_dsn
from runtime.storage.sessions import SessionStoreError

_FENCED_UPSERT = (
    "INSERT INTO sessions AS s (agent_id, session_key, session_id, entry, written_by) "
    "SELECT $1, u.k, u.sid, u.e::jsonb, u.fr FROM unnest($2::text[], $3::text[], "
    "$4::text[], $5::text[], $6::text[], $7::bigint[]) AS u(k, sid, e, fn, fr, fg) "
    f"WHERE u.fn IS NULL OR {holds('u.fn', 'u.fr', 'u.fg', lock=False)} "
    "ON CONFLICT (agent_id, session_key) DO UPDATE SET session_id = EXCLUDED.session_id, "
    "entry = EXCLUDED.entry, written_by = EXCLUDED.written_by, updated_at = now() "
    "RETURNING session_key")
# A new session id for a key only while the current one is still the one the writer
# replaces ($7; NULL: the key has none): one current session id per key, cluster-wide.
_CLAIM = (
    "INSERT INTO sessions AS s (agent_id, session_key, session_id, entry, written_by) "
    "SELECT $1, $2, $3, $4::jsonb, $6 "
    f"WHERE $5::text IS NULL OR {holds('$5', '$6', '$8::bigint')} "
    "ON CONFLICT (agent_id, session_key) DO UPDATE SET session_id = EXCLUDED.session_id, "
    "entry = EXCLUDED.entry, written_by = EXCLUDED.written_by, updated_at = now() "
    "WHERE s.session_id = $7 RETURNING session_key")
FIX = "check that PostgreSQL is up and the schema migrated (`tidegate storage status`)"


class PgSessionRecords:
    """One agent's session records in PostgreSQL, through a shared :class:`SyncBridge`."""

    def __init__(self, bridge: SyncBridge, agent: str) -> None:
        self.bridge = bridge
        self.agent = agent
        self.path = f"postgresql sessions (agent {agent})"
        self.rows_written = 0
        self.transactions = 0

    def load_all(self) -> dict[str, dict[str, Any]]:
        async def fetch(conn: asyncpg.Connection) -> list[Any]:
            return await conn.fetch("SELECT session_key, entry::text FROM sessions "
                                    "WHERE agent_id = $1", self.agent)
        try:
            rows = self.bridge.call(fetch)
        except _DB_ERRORS as exc:
            raise SessionStoreError(f"session store in PostgreSQL at "
                                    f"{redact_dsn(self.bridge.dsn)} is unreadable ({exc})",
                                    path=self.path, fix=FIX) from None
        return {k: v for k, raw in rows if isinstance(v := json.loads(raw), dict)}

    def write(self, upserts: dict[str, dict[str, Any]], deletes: list[str]) -> int:
        async def run(conn: asyncpg.Connection) -> None:
            async with conn.transaction():
                if upserts:
                    await conn.executemany(
                        "INSERT INTO sessions (agent_id, session_key, session_id, entry) "
                        "VALUES ($1, $2, $3, $4::jsonb) ON CONFLICT (agent_id, session_key) "
                        "DO UPDATE SET session_id = EXCLUDED.session_id, "
                        "entry = EXCLUDED.entry, updated_at = now()",
                        [(self.agent, k, str(v.get("session_id", "")),
                          json.dumps(v, ensure_ascii=False, separators=(",", ":")))
                         for k, v in upserts.items()])
                if deletes:
                    await conn.execute("DELETE FROM sessions WHERE agent_id = $1 AND "
                                       "session_key = ANY($2::text[])", self.agent, deletes)
        try:
            self.bridge.call(run)
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: write failed ({exc})") from None
        self.transactions += 1
        self.rows_written += len(upserts) + len(deletes)
        return len(upserts) + len(deletes)

    def load_one(self, key: str) -> dict[str, Any] | None:
        """The stored record of ``key`` (None: none). Raises OSError."""
        try:
            raw = self.bridge.call(lambda c: c.fetchval(
                "SELECT entry::text FROM sessions WHERE agent_id = $1 AND session_key = $2",
                self.agent, key))
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: read failed ({exc})") from None
        value = json.loads(raw) if raw is not None else None
        return value if isinstance(value, dict) else None

    def claim_id(self, key: str, record: dict[str, Any], replaces: str | None,
                 fence: Fence | None = None) -> tuple[bool, dict[str, Any] | None]:
        """Make ``record`` (a new session id) ``key``'s current session, compare-and-set:
        only when the stored session id is still ``replaces`` (None: no row yet) and,
        with ``fence``, while that lane lease is current. Returns ``(True, None)`` when
        written, else ``(False, the stored record or None)``. Raises OSError."""
        raw = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        name, replica, gen = fence or (None, None, None)

        async def run(conn: asyncpg.Connection) -> tuple[bool, Any]:
            async with conn.transaction():
                done = await conn.fetchval(_CLAIM, self.agent, key,
                                           str(record.get("session_id", "")), raw, name,
                                           replica, replaces, gen)
                if done is not None:
                    return True, None
                return False, await conn.fetchval(
                    "SELECT entry::text FROM sessions WHERE agent_id = $1 AND "
                    "session_key = $2", self.agent, key)
        try:
            written, stored = self.bridge.call(run)
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: write failed ({exc})") from None
        self.transactions += 1
        if written:
            self.rows_written += 1
        value = json.loads(stored) if stored is not None else None
        return written, value if isinstance(value, dict) else None

    def write_fenced(self, upserts: dict[str, dict[str, Any]], deletes: list[str],
                     fences: dict[str, Fence]) -> list[str]:
        """:meth:`write`, each upsert of a key in ``fences`` only while that lane lease
        is current (one statement, one transaction with the deletes). Returns the keys
        refused. Raises OSError."""
        keys = list(upserts)
        cols = [keys, [str(upserts[k].get("session_id", "")) for k in keys],
                [json.dumps(upserts[k], ensure_ascii=False, separators=(",", ":"))
                 for k in keys]]
        cols += [[(fences.get(k) or (None, None, None))[i] for k in keys] for i in range(3)]

        async def run(conn: asyncpg.Connection) -> set[str]:
            async with conn.transaction():
                written = {r[0] for r in await conn.fetch(_FENCED_UPSERT, self.agent, *cols)}
                if deletes:
                    await conn.execute("DELETE FROM sessions WHERE agent_id = $1 AND "
                                       "session_key = ANY($2::text[])", self.agent, deletes)
            return written
        try:
            written = self.bridge.call(run)
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: write failed ({exc})") from None
        self.transactions += 1
        self.rows_written += len(written) + len(deletes)
        return [k for k in keys if k not in written]

    def close(self) -> None:
        """The bridge is shared by every agent; its owner closes it."""
