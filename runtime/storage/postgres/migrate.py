"""Versioned schema migrations for the PostgreSQL backend.

Files: ``runtime/storage/postgres/migrations/NNNN_name.sql`` (NNNN the version, unique).
Each file runs in its own transaction together with its row in ``tidegate_migrations``
(version, name, sha256 checksum, applied_at), so a failure leaves nothing half applied.
Every file whose version is not in the ledger is applied, in version order (the storage
backend numbers its files from 0001, the cluster tables from 0100, so both sides can add
files independently). An applied file whose checksum changed is reported (``status``
state ``modified``) and refuses ``migrate``: schema history is append-only, a change is a
new file.

Concurrency: ``migrate`` holds ``pg_advisory_lock(MIGRATION_LOCK)`` (session level) while
it reads the ledger and applies files, so N replicas starting at once against an empty
database apply each file exactly once; the others wait, then find nothing to do.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

import asyncpg
import structlog

from runtime.storage.postgres.errors import MigrationError

log = structlog.get_logger(__name__)

# pg_advisory_lock key: the first 8 bytes of sha256("tidegate.migrations"), fixed forever.
MIGRATION_LOCK = int.from_bytes(hashlib.sha256(b"tidegate.migrations").digest()[:8],
                                "big", signed=True)
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_LEDGER = """
CREATE TABLE IF NOT EXISTS tidegate_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class MigrationState:
    version: int
    name: str
    state: str  # applied | pending | modified | unknown (in the database, not in this build)
    applied_at: str | None = None


SHIPPED = "runtime.storage.postgres.migrations"


def available(source: Traversable | None = None) -> list[Migration]:
    """Every migration file in ``source`` (default: the package ``SHIPPED`` of this build),
    in version order. Raises MigrationError on two files with one version, and when there
    is no migration file at all: an installation without them (package data left out of
    the wheel) must never report its empty schema as up to date."""
    source = resources.files(SHIPPED) if source is None else source
    out: dict[int, Migration] = {}
    for entry in source.iterdir():
        m = _FILE.match(entry.name)
        if not m:
            continue
        version = int(m.group(1))
        if version in out:
            raise MigrationError(f"two migration files have version {version:04d}: "
                                 f"{out[version].name} and {m.group(2)}")
        out[version] = Migration(version, m.group(2), entry.read_text("utf-8"))
    if not out:
        raise MigrationError(f"no schema migration files (NNNN_name.sql) in {source}: this "
                             "installation of tidegate is incomplete; reinstall it")
    return [out[v] for v in sorted(out)]


async def _ledger(conn: asyncpg.Connection) -> dict[int, asyncpg.Record]:
    if await conn.fetchval("SELECT to_regclass('tidegate_migrations')") is None:
        return {}
    rows = await conn.fetch("SELECT version, name, checksum, applied_at "
                            "FROM tidegate_migrations ORDER BY version")
    return {r["version"]: r for r in rows}


async def status(conn: asyncpg.Connection,
                 source: Traversable | None = None) -> list[MigrationState]:
    """Each migration's state, by version; read-only (takes no lock, creates nothing).
    Raises MigrationError as ``available``."""
    shipped = available(source)
    ledger = await _ledger(conn)
    out = []
    for m in shipped:
        row = ledger.pop(m.version, None)
        if row is None:
            out.append(MigrationState(m.version, m.name, "pending"))
        else:
            state = "applied" if row["checksum"] == m.checksum else "modified"
            out.append(MigrationState(m.version, m.name, state, row["applied_at"].isoformat()))
    out.extend(MigrationState(v, r["name"], "unknown", r["applied_at"].isoformat())
               for v, r in ledger.items())
    return sorted(out, key=lambda s: s.version)


async def migrate(conn: asyncpg.Connection,
                  source: Traversable | None = None) -> list[Migration]:
    """Apply every pending migration of ``source`` (default: the shipped ones) under the
    advisory lock; returns those applied here (empty when another process got there
    first). Raises MigrationError."""
    shipped = available(source)
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
    try:
        await conn.execute(_LEDGER)
        ledger = await _ledger(conn)
        todo = []
        for m in shipped:
            row = ledger.get(m.version)
            if row is None:
                todo.append(m)
            elif row["checksum"] != m.checksum:
                raise MigrationError(
                    f"migration {m.version:04d}_{m.name} was changed after it was applied "
                    "(checksum differs); restore the file and add a new migration instead")
        for m in todo:
            await _apply(conn, m)
        return todo
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)


async def _apply(conn: asyncpg.Connection, m: Migration) -> None:
    try:
        async with conn.transaction():
            await conn.execute(m.sql)
            await conn.execute("INSERT INTO tidegate_migrations (version, name, checksum) "
                               "VALUES ($1, $2, $3)", m.version, m.name, m.checksum)
    except asyncpg.PostgresError as exc:
        raise MigrationError(f"migration {m.version:04d}_{m.name} failed: {exc}") from None
    log.info("storage_migration_applied", version=m.version, name=m.name)
