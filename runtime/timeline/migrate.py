"""Schema migrations of an existing SQLite ``timeline.db`` (run by
:class:`runtime.timeline.store.SqliteTimelineStore` when it opens a database for writing).

The events table carries ``CHECK (event_type IN (...))``; SQLite cannot change a CHECK in
place, so a database written before a type was added (e.g. ``SUBAGENT_SPAWN`` and
``SUBAGENT_ANNOUNCE``, issue 11) would refuse those appends. :func:`migrate_event_types`
rebuilds the table in ONE transaction: the new table is created, every row is copied
byte for byte in rowid order (event ids, seq, content, prev_hash and hash unchanged, so
every chain verifies as before), the old table is dropped, the new one renamed, and the
immutability triggers and ``user_version`` are recreated before the commit. A crash at any
instant leaves either the old database or the migrated one, never a table without its
triggers. Source: SQLite "ALTER TABLE" docs, "Making Other Kinds Of Table Schema Changes".
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable

import structlog

from runtime.timeline.model import EVENT_TYPES
from runtime.timeline.verify import EVENT_COLS

log = structlog.get_logger(__name__)

_TEMP = "timeline_events_migrating"


def missing_event_types(conn: sqlite3.Connection) -> list[str]:
    """Event types the existing events table's CHECK does not allow ([] for a fresh
    database or an up-to-date one)."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND "
                       "name = 'timeline_events'").fetchone()
    if row is None or not row[0]:
        return []
    return sorted(t for t in EVENT_TYPES if f"'{t}'" not in row[0])


def statements(script: str) -> Iterable[str]:
    """The complete SQL statements of ``script`` (trigger bodies kept whole)."""
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                yield buf.strip()
            buf = ""
    if buf.strip():
        yield buf.strip()


def migrate_event_types(conn: sqlite3.Connection, path: str, events_ddl: str,
                        schema: str) -> list[str]:
    """Rebuild ``timeline_events`` when its CHECK lacks current event types (see the
    module docstring). ``events_ddl`` is the CREATE TABLE statement with ``{name}`` for
    the table name; ``schema`` the full schema script (triggers, user_version), run inside
    the same transaction. ``conn`` is in autocommit mode (``isolation_level=None``).
    Returns the added types ([] when nothing was done). Raises sqlite3.Error (the
    transaction is rolled back, the database unchanged)."""
    added = missing_event_types(conn)
    if not added:
        return []
    t0 = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(events_ddl.format(name=_TEMP))
        conn.execute(f"INSERT INTO {_TEMP} ({EVENT_COLS}) SELECT {EVENT_COLS} "
                     "FROM timeline_events ORDER BY rowid")
        before = conn.execute("SELECT count(*) FROM timeline_events").fetchone()[0]
        after = conn.execute(f"SELECT count(*) FROM {_TEMP}").fetchone()[0]
        if before != after:  # cannot happen; refuse rather than lose history
            raise sqlite3.DatabaseError(f"copied {after} of {before} timeline events")
        conn.execute("DROP TABLE timeline_events")
        conn.execute(f"ALTER TABLE {_TEMP} RENAME TO timeline_events")
        for stmt in statements(schema):
            conn.execute(stmt)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    log.warning("timeline_schema_migrated", path=path, added_event_types=added,
                events=before, ms=round((time.perf_counter() - t0) * 1000, 1))
    return added
