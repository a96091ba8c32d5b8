"""The PostgreSQL :class:`runtime.storage.sessions.SessionRecords` backend: table
``sessions`` (``migrations/0001_sessions.sql``), one row per (agent, session key), the
entry as jsonb. Like the SQLite backend it writes only the changed rows, in one
transaction (upsert + delete), so a change costs the same whatever the number of sessions.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import redact_dsn
from runtime.storage.sessions import SessionStoreError

_DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)
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

    def close(self) -> None:
        """The bridge is shared by every agent; its owner closes it."""
