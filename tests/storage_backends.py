"""Both storage backends behind one test-facing shape, for the parametrised behavioural
tests (issue 15 "the same behavioural tests run against both backends").

``Backend.raw(sql)`` runs SQL on a separate, plain connection (sqlite3 on the file, or
asyncpg on the database) the way an operator with database access would; ``tamper(sql)``
does the same with the immutability triggers out of the way (SQLite: dropped;
PostgreSQL: ``session_replication_role = replica``), to prove ``verify`` still catches it.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import asyncpg

from runtime.storage.config import StorageSection
from runtime.storage.postgres.pool import open_database
from runtime.timeline import Timeline
from runtime.timeline.schema import TRIGGERS as SQLITE_TRIGGERS


def pg_query(dsn: str, sql: str) -> list[tuple]:
    """Run ``sql`` on a fresh plain connection (blocking; for sync tests)."""
    async def run() -> list[tuple]:
        conn = await asyncpg.connect(dsn)
        try:
            return [tuple(r) for r in await conn.fetch(sql)]
        finally:
            await conn.close()
    return asyncio.run(run())


class RefusedError(Exception):
    """The database refused the statement (a trigger or constraint); str() is its message."""


class Backend:
    name = ""

    async def timeline(self, clock: Any) -> Timeline:
        raise NotImplementedError

    async def raw(self, sql: str) -> list[tuple]:
        raise NotImplementedError

    async def tamper(self, sql: str) -> None:
        raise NotImplementedError

    async def session_records(self, agent: str) -> Any:
        """The SessionRecords for ``agent`` (None: the SQLite default at ``sessions_db``)."""
        return None

    async def stored_sessions(self, agent: str) -> dict[str, dict]:
        """``{session_key: entry}`` as committed, read with a plain connection."""
        raise NotImplementedError

    async def records(self, store: str) -> Any:
        """The backend of ``store`` (``cron``, ``outbox``, ``dedupe``, ...), or None for
        the embedded default (files under ``tmp``)."""
        return None

    async def transcripts(self, clock: Any) -> Any:
        """The backend's TranscriptStore (runtime/storage/transcripts.py)."""
        raise NotImplementedError

    async def close(self) -> None:
        pass


class EmbeddedBackend(Backend):
    name = "embedded"

    def __init__(self, tmp: Path) -> None:
        self.db = tmp / "timeline.db"
        self.tmp = tmp
        self.opened: list[Timeline] = []

    def sessions_db(self, agent: str) -> Path:
        return self.tmp / "agents" / agent / "sessions.db"

    async def stored_sessions(self, agent: str) -> dict[str, dict]:
        conn = sqlite3.connect(self.sessions_db(agent))
        try:
            return {k: json.loads(v) for k, v in conn.execute(
                "SELECT session_key, entry FROM sessions")}
        finally:
            conn.close()

    async def timeline(self, clock: Any) -> Timeline:
        self.opened.append(await Timeline.open_sqlite(self.db, clock=clock))
        return self.opened[-1]

    async def _committed(self) -> None:
        """Raw SQL sees only what is committed: commit the pending log first."""
        for tl in self.opened:
            await tl.store.flush()

    async def transcripts(self, clock: Any) -> Any:
        from runtime.storage.embedded.transcripts import FileTranscripts
        return FileTranscripts(self.tmp / "state")

    async def raw(self, sql: str) -> list[tuple]:
        await self._committed()
        conn = sqlite3.connect(self.db, isolation_level=None)
        try:
            return conn.execute(sql).fetchall()
        except sqlite3.IntegrityError as exc:
            raise RefusedError(str(exc)) from None
        finally:
            conn.close()

    async def tamper(self, sql: str) -> None:
        await self._committed()
        conn = sqlite3.connect(self.db, isolation_level=None)
        try:
            for name in SQLITE_TRIGGERS:
                conn.execute(f"DROP TRIGGER IF EXISTS {name}")
            conn.execute(sql)
        finally:
            conn.close()


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.pools: list[asyncpg.Pool] = []
        self.bridges: list[Any] = []

    def sessions_db(self, agent: str) -> Path:
        return Path("/nonexistent/unused-on-postgres") / agent

    async def session_records(self, agent: str) -> Any:
        from runtime.storage.postgres.bridge import SyncBridge
        from runtime.storage.postgres.sessions import PgSessionRecords
        await self.pool()  # migrated
        bridge = await asyncio.to_thread(SyncBridge, self.dsn)
        self.bridges.append(bridge)
        return PgSessionRecords(bridge, agent)

    async def bridge(self) -> Any:
        """A migrated database behind a fresh SyncBridge (closed with the backend)."""
        from runtime.storage.postgres.bridge import SyncBridge
        await self.pool()  # migrated
        bridge = await asyncio.to_thread(SyncBridge, self.dsn)
        self.bridges.append(bridge)
        return bridge

    async def records(self, store: str) -> Any:
        from runtime.storage.postgres import stores
        return stores.open_records(store, await self.bridge(), replica="test-replica")

    async def stored_sessions(self, agent: str) -> dict[str, dict]:
        rows = await self.raw(f"SELECT session_key, entry::text FROM sessions "
                              f"WHERE agent_id = '{agent}'")
        return {k: json.loads(v) for k, v in rows}

    async def pool(self) -> asyncpg.Pool:
        """A migrated pool of its own (one per "replica")."""
        pool = await open_database(StorageSection(backend="postgres", dsn=self.dsn,
                                                  pool={"min": 1, "max": 4}))
        self.pools.append(pool)
        return pool

    async def timeline(self, clock: Any) -> Timeline:
        return await Timeline.open_postgres(await self.pool(), clock=clock)

    async def transcripts(self, clock: Any) -> Any:
        from runtime.storage.postgres.transcripts import PgTranscripts
        pool = await self.pool()
        return PgTranscripts(await self.bridge(), pool, clock=clock)

    async def raw(self, sql: str) -> list[tuple]:
        conn = await asyncpg.connect(self.dsn)
        try:
            return [tuple(r) for r in await conn.fetch(sql)]
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise RefusedError(str(exc)) from None
        finally:
            await conn.close()

    async def tamper(self, sql: str) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute("SET session_replication_role = replica")  # no triggers
            await conn.execute(sql)
        finally:
            await conn.close()

    async def close(self) -> None:
        for pool in self.pools:
            await pool.close()
        for bridge in self.bridges:
            await asyncio.to_thread(bridge.close)
