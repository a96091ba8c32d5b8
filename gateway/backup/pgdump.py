"""Backups on PostgreSQL storage: a consistent snapshot of the tidegate schema and its
restore into an empty database.

**Snapshot** (:func:`dump`): one ``REPEATABLE READ READ ONLY`` transaction (every table
is read at the same instant while the gateway keeps committing), one binary ``COPY`` per
table of the connection's ``current_schema()`` (asyncpg's copy API; a partitioned table
is copied through its parent, so every partition is in), the value of every sequence,
the applied migrations (version, name, checksum) and the agents that own a transcript
partition. Not copied: the migration ledger (a restore applies those migrations) and the
replicas' liveness rows (``cluster_replicas``, ``cluster_leases``: the restored gateway
takes its accounts at once instead of waiting for a dead replica's lease to expire; the
lease generation sequence is kept, so fencing tokens only grow).

Manifest part ``"postgres"``::

    {"schema": name, "server_version": text, "migrations": [{"version", "name", "checksum"}],
     "tables": [{"name", "file": "postgres/<name>.copy", "rows": N, "partitioned": bool,
                 "columns": [[name, type], ...]}],
     "sequences": {name: [last_value, is_called]}, "transcript_agents": [agent, ...]}

**Restore** (:func:`load`): refuses a database whose schema already holds a table or
sequence (:class:`LoadRefused`); then, in one transaction:
applies exactly the backup's migrations (this build must ship each with the same
checksum), creates the transcript partitions, loads every table with ``COPY FROM`` (the
tables' user triggers disabled meanwhile: the timeline refuses events for an archived
session, which is right for writers and wrong for a restore), sets every sequence, and
compares each table's row count with the manifest. Migrations newer than the backup are
applied afterwards, as at a gateway start.

:func:`read_copy` decodes a binary COPY file (row count; values of ``text`` and integer
columns) so ``backup verify`` can check the timeline chains without a database.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg

COPY_PREFIX = "postgres/"
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_LEDGER = "tidegate_migrations"
# who is alive and who holds which account right now: meaningless on the restored host
# (a restored lease of a replica that is gone would hold its accounts until it expired)
_LIVENESS = frozenset({"cluster_replicas", "cluster_leases"})
_TABLES = """
SELECT c.relname, c.relkind = 'p' AS partitioned FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition
ORDER BY c.relname"""
_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
  AND a.attgenerated = '' ORDER BY a.attnum"""
_SEQUENCES = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind = 'S' ORDER BY c.relname"""
_OCCUPIED = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'S', 'v', 'm')
ORDER BY c.relname LIMIT 3"""


class DumpFormatError(ValueError):
    """A COPY file is not in PostgreSQL's binary COPY format (the message says where)."""


class LoadRefused(RuntimeError):
    """The database cannot take the dump (not empty, or a migration this build lacks);
    nothing was written."""


class LoadMismatch(RuntimeError):
    """A table's row count after loading differs from the manifest (rolled back)."""


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def dump(dsn: str, out_dir: Path) -> dict[str, Any]:
    """Write ``<out_dir>/<table>.copy`` for every table of the schema in one snapshot;
    returns the manifest part (module docstring). Raises asyncpg/OS errors."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            return await _dump_in_snapshot(conn, out_dir)
    finally:
        await conn.close()


async def _dump_in_snapshot(conn: asyncpg.Connection, out_dir: Path) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = []
    for row in await conn.fetch(_TABLES):
        name = row["relname"]
        if name == _LEDGER or name in _LIVENESS:
            continue
        cols = [(c[0], c[1]) for c in await conn.fetch(_COLUMNS, _ident(name))]
        path = out_dir / f"{name}.copy"
        names = [c[0] for c in cols]
        if row["partitioned"]:  # COPY TO refuses a partitioned table: copy its rows
            status = await conn.copy_from_query(
                f"SELECT {', '.join(map(_ident, names))} FROM {_ident(name)}",
                output=str(path), format="binary")
        else:
            status = await conn.copy_from_table(name, columns=names, output=str(path),
                                                format="binary")
        tables.append({"name": name, "file": COPY_PREFIX + path.name,
                       "rows": int(status.split()[-1]), "partitioned": row["partitioned"],
                       "columns": [list(c) for c in cols]})
    sequences = {}
    for (seq,) in await conn.fetch(_SEQUENCES):
        r = await conn.fetchrow(f"SELECT last_value, is_called FROM {_ident(seq)}")
        sequences[seq] = [int(r["last_value"]), bool(r["is_called"])]
    migrations = []
    if await conn.fetchval("SELECT to_regclass('tidegate_migrations')") is not None:
        migrations = [dict(r) for r in await conn.fetch(
            "SELECT version, name, checksum FROM tidegate_migrations ORDER BY version")]
    agents = []
    if any(t["name"] == "transcript_lines" for t in tables):
        agents = [r[0] for r in await conn.fetch(
            "SELECT DISTINCT agent_id FROM transcript_lines ORDER BY 1")]
    return {"schema": await conn.fetchval("SELECT current_schema()"),
            "server_version": await conn.fetchval("SHOW server_version"),
            "migrations": migrations, "tables": tables, "sequences": sequences,
            "transcript_agents": agents}


async def occupied(conn: asyncpg.Connection) -> list[str]:
    """Up to three relations already in the connection's schema (empty: a fresh one)."""
    return [r[0] for r in await conn.fetch(_OCCUPIED)]


def check_migrations(part: dict[str, Any]) -> list[Any]:
    """This build's migrations the dump was made with, in order. Raises LoadRefused when
    one is missing from this build or differs (checksum)."""
    from runtime.storage.postgres.migrate import available
    shipped = {m.version: m for m in available()}
    todo = []
    for m in part["migrations"]:
        have = shipped.get(m["version"])
        if have is None or have.checksum != m["checksum"]:
            how = "missing from" if have is None else "different in"
            raise LoadRefused(f"the backup's schema migration {m['version']:04d}_{m['name']}"
                              f" is {how} this tidegate build: restore with the version "
                              "that made the backup (or newer)")
        todo.append(have)
    return todo


async def load(dsn: str, part: dict[str, Any], copy_dir: Path) -> dict[str, int]:
    """Load a dump (``part``: the manifest's ``"postgres"``; files in ``copy_dir``) into
    the empty database at ``dsn``; returns ``{table: rows}`` as counted after loading.
    Raises LoadRefused (not empty, or a migration this build lacks; nothing written),
    LoadMismatch (a count differs; rolled back) or asyncpg errors."""
    from runtime.storage.postgres.migrate import _LEDGER as LEDGER_DDL
    from runtime.storage.postgres.migrate import migrate
    todo = check_migrations(part)
    conn = await asyncpg.connect(dsn)
    try:
        if taken := await occupied(conn):
            raise LoadRefused(f"the database's schema is not empty (it has "
                              f"{', '.join(taken)}): restore only into an empty database")
        async with conn.transaction():
            await conn.execute(LEDGER_DDL)
            for m in todo:
                await conn.execute(m.sql)
                await conn.execute("INSERT INTO tidegate_migrations (version, name, checksum)"
                                   " VALUES ($1, $2, $3)", m.version, m.name, m.checksum)
            counts = await _load_tables(conn, part, copy_dir)
            for t in part["tables"]:
                if counts[t["name"]] != t["rows"]:
                    raise LoadMismatch(f"{t['name']}: {counts[t['name']]} rows after "
                                       f"loading, the manifest says {t['rows']}")
        await migrate(conn)  # what this build has beyond the backup
        return counts
    finally:
        await conn.close()


async def _load_tables(conn: asyncpg.Connection, part: dict[str, Any],
                       copy_dir: Path) -> dict[str, int]:
    """COPY every table in (user triggers off meanwhile), set the sequences; the row
    count of each table afterwards."""
    for agent in part.get("transcript_agents", []):
        await conn.execute("SELECT transcript_partition($1)", agent)
    counts = {}
    for t in part["tables"]:
        name, plain = _ident(t["name"]), not t["partitioned"]
        if plain:
            await conn.execute(f"ALTER TABLE {name} DISABLE TRIGGER USER")
        await conn.copy_to_table(t["name"], source=str(copy_dir / Path(t["file"]).name),
                                 columns=[c[0] for c in t["columns"]], format="binary")
        if plain:
            await conn.execute(f"ALTER TABLE {name} ENABLE TRIGGER USER")
        counts[t["name"]] = await conn.fetchval(f"SELECT count(*) FROM {name}")
    for seq, (value, called) in part["sequences"].items():
        await conn.execute("SELECT setval($1::regclass, $2, $3)", _ident(seq), value, called)
    return counts


def read_copy(path: Path, types: list[str] | None = None) -> Iterator[tuple]:
    """The rows of a binary COPY file. ``types`` (the manifest's column types): decode
    ``text``/``character varying`` to str and ``bigint``/``integer``/``smallint`` to int,
    others stay bytes; None: every value stays bytes (or None for NULL). Raises
    DumpFormatError on a malformed file."""
    data = path.read_bytes()
    if not data.startswith(_SIGNATURE) or len(data) < 19:
        raise DumpFormatError(f"{path.name}: not a binary COPY file (bad signature)")
    pos = 19 + struct.unpack_from(">i", data, 15)[0]
    while True:
        if pos + 2 > len(data):
            raise DumpFormatError(f"{path.name}: ends without the COPY trailer")
        (n,) = struct.unpack_from(">h", data, pos)
        pos += 2
        if n == -1:
            if pos != len(data):
                raise DumpFormatError(f"{path.name}: data after the COPY trailer")
            return
        if types is not None and n != len(types):
            raise DumpFormatError(f"{path.name}: a row has {n} fields, expected {len(types)}")
        row = []
        for i in range(n):
            if pos + 4 > len(data):
                raise DumpFormatError(f"{path.name}: a row is cut short")
            (size,) = struct.unpack_from(">i", data, pos)
            pos += 4
            if size == -1:
                row.append(None)
                continue
            if size < 0 or pos + size > len(data):
                raise DumpFormatError(f"{path.name}: a field is cut short")
            raw = data[pos:pos + size]
            pos += size
            row.append(_decode(raw, types[i]) if types is not None else raw)
        yield tuple(row)


_INTS = {"bigint": ">q", "integer": ">i", "smallint": ">h"}


def _decode(raw: bytes, typ: str) -> Any:
    if typ == "text" or typ.startswith("character varying"):
        return raw.decode("utf-8")
    fmt = _INTS.get(typ)
    return struct.unpack(fmt, raw)[0] if fmt else raw


_TIMELINE_DDL = """
CREATE TABLE timelines (session_id TEXT PRIMARY KEY, session_key TEXT, status TEXT,
    created_at INTEGER, ended_at INTEGER, last_seq INTEGER, last_hash TEXT,
    last_timestamp INTEGER);
CREATE TABLE timeline_events (event_id TEXT PRIMARY KEY, session_id TEXT, seq INTEGER,
    timestamp INTEGER, event_type TEXT, content TEXT, prev_hash TEXT, hash TEXT);
CREATE INDEX timeline_events_order ON timeline_events (session_id, seq);"""


def timeline_copy(part: dict[str, Any], copy_dir: Path, db: Path) -> bool:
    """Rebuild the dump's timeline as a SQLite file at ``db`` (the columns the embedded
    verifier reads, no triggers) so its chains can be verified offline. False when the
    dump has no timeline tables. Raises DumpFormatError, sqlite3.Error."""
    import sqlite3

    from runtime.timeline.verify import EVENT_COLS, INFO_COLS
    tables = {t["name"]: t for t in part["tables"]}
    if "timelines" not in tables or "timeline_events" not in tables:
        return False
    conn = sqlite3.connect(db)
    try:
        conn.executescript(_TIMELINE_DDL)
        for name, cols in (("timelines", INFO_COLS), ("timeline_events", EVENT_COLS)):
            t = tables[name]
            want = [c.strip().strip('"') for c in cols.split(",")]
            have = [c[0] for c in t["columns"]]
            if missing := [c for c in want if c not in have]:
                raise DumpFormatError(f"{t['file']}: no column {missing[0]}")
            idx = [have.index(c) for c in want]
            rows = read_copy(copy_dir / Path(t["file"]).name, [c[1] for c in t["columns"]])
            conn.executemany(f"INSERT INTO {name} ({cols}) VALUES "
                             f"({', '.join('?' * len(want))})",
                             ([r[i] for i in idx] for r in rows))
        conn.commit()
    finally:
        conn.close()
    return True
