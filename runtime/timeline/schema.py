"""The SQLite timeline's schema and connections: the events table guarded by
immutability triggers, the per-session head row, pragmas, and the check that the triggers
are still there (used by ``store.py``; the module docstring there describes the design).
"""

from __future__ import annotations

import sqlite3

import structlog

from runtime.timeline.model import EVENT_TYPES

log = structlog.get_logger(__name__)

_TYPES_SQL = ", ".join(f"'{t}'" for t in sorted(EVENT_TYPES))
EVENTS_DDL = f"""CREATE TABLE IF NOT EXISTS {{name}} (
    event_id   TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    timestamp  INTEGER NOT NULL,
    event_type TEXT NOT NULL CHECK (event_type IN ({_TYPES_SQL})),
    content    TEXT NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL,
    UNIQUE (session_id, seq)
);"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS timelines (
    session_id     TEXT PRIMARY KEY,
    session_key    TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('active', 'archived')),
    created_at     INTEGER NOT NULL,
    ended_at       INTEGER,
    last_seq       INTEGER NOT NULL,
    last_hash      TEXT NOT NULL,
    last_timestamp INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS timelines_by_key ON timelines (session_key, created_at);
{EVENTS_DDL.format(name="timeline_events")}
CREATE TRIGGER IF NOT EXISTS timeline_events_no_update BEFORE UPDATE ON timeline_events
BEGIN SELECT RAISE(ABORT, 'timeline events are immutable: UPDATE refused'); END;
CREATE TRIGGER IF NOT EXISTS timeline_events_no_delete BEFORE DELETE ON timeline_events
BEGIN SELECT RAISE(ABORT, 'timeline events are immutable: DELETE refused'); END;
CREATE TRIGGER IF NOT EXISTS timeline_events_active_only BEFORE INSERT ON timeline_events
WHEN NOT EXISTS (SELECT 1 FROM timelines WHERE session_id = NEW.session_id AND status = 'active')
BEGIN SELECT RAISE(ABORT, 'timeline is archived or unknown: INSERT refused'); END;
CREATE TRIGGER IF NOT EXISTS timelines_archived_frozen BEFORE UPDATE ON timelines
WHEN OLD.status = 'archived'
BEGIN SELECT RAISE(ABORT, 'timeline is archived: UPDATE refused (cannot un-archive)'); END;
CREATE TRIGGER IF NOT EXISTS timelines_head_forward BEFORE UPDATE ON timelines
WHEN NEW.last_seq < OLD.last_seq
BEGIN SELECT RAISE(ABORT, 'timeline head cannot move backwards'); END;
CREATE TRIGGER IF NOT EXISTS timelines_no_delete BEFORE DELETE ON timelines
BEGIN SELECT RAISE(ABORT, 'timelines are permanent: DELETE refused'); END;
CREATE TRIGGER IF NOT EXISTS timelines_identity_frozen
BEFORE UPDATE OF session_id, session_key, created_at ON timelines
BEGIN SELECT RAISE(ABORT, 'timeline identity is permanent: UPDATE refused'); END;
PRAGMA user_version = 2;
"""
# user_version 1 added timelines_identity_frozen; bump it with every new trigger.
# user_version 2: the SUBAGENT_* event types (runtime/timeline/migrate.py rebuilds the CHECK).

TRIGGERS = ("timeline_events_no_update", "timeline_events_no_delete",
            "timeline_events_active_only", "timelines_archived_frozen", "timelines_head_forward",
            "timelines_no_delete", "timelines_identity_frozen")
"""The immutability triggers of ``SCHEMA``; any of them missing means someone dropped it
(except triggers newer than the database's schema version: those are simply added)."""
_TRIGGER_SINCE = {"timelines_identity_frozen": 1}


# 4 KiB pages (new databases). Rows arrive in flushes minutes apart (pending.py), not one
# transaction per turn: what counts is how densely they pack. ~370-byte event rows left
# 27% of each 1 KiB page empty (two rows fit, a third did not), and every byte the file
# grows by is written twice (WAL, then checkpoint); 4 KiB pages waste ~5%.
PAGE_SIZE = 4096


def connect(path: str, *, readonly: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA busy_timeout=30000")
    if readonly:
        conn.execute("PRAGMA query_only=ON")
    else:
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # only takes effect on a new file
        set_journal_mode(conn, path)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA wal_autocheckpoint=0")
    return conn


# A rollback journal, not WAL (issue 9 "Disk"). Rows reach SQLite only in flushes minutes
# apart (pending.py), so WAL's concurrency buys little, and its price is every page
# written twice: into the WAL, then by the checkpoint into the file. Flushes append: the
# journal holds only the few existing pages a flush changes (tail leaves, interior pages,
# the head row, the header), the new rows are written once. Readers wait out a flush
# (busy_timeout) instead of reading a snapshot beside it.
JOURNAL_MODE = "truncate"


def set_journal_mode(conn: sqlite3.Connection, path: str) -> str:
    """Put the database in ``JOURNAL_MODE`` (a database still in WAL is converted once,
    which needs it to be open nowhere else: else it stays in WAL, with a warning, and is
    converted at the next open). Returns the mode in force."""
    conn.execute("PRAGMA busy_timeout=200")  # a converting open does not wait 30 s
    try:
        mode = conn.execute(f"PRAGMA journal_mode={JOURNAL_MODE}").fetchone()[0]
    except sqlite3.OperationalError as exc:  # locked: another process has it open
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        log.warning("timeline_journal_mode_kept", path=path, mode=mode, error=str(exc),
                    effect=f"stays in {mode} mode until an open finds it unused")
    finally:
        conn.execute("PRAGMA busy_timeout=30000")
    return mode


def check_triggers(conn: sqlite3.Connection, path: str, *, recreate: bool) -> list[str]:
    """Warn (loudly) when an existing database lacks immutability triggers; return them.

    A fresh file has no tables yet and is not reported. The caller recreates the triggers
    (``SCHEMA``) when it may write; history written while they were gone is only as
    trustworthy as ``verify`` says.
    """
    names = {r[0]: r[1] for r in conn.execute(
        "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'trigger')")}
    if "timelines" not in names:
        return []
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    missing = [t for t in TRIGGERS
               if names.get(t) != "trigger" and _TRIGGER_SINCE.get(t, 0) <= version]
    if missing:
        log.warning("timeline_triggers_missing", path=path, missing=missing,
                    action="recreated" if recreate else "none (read-only)",
                    hint="the timeline's immutability triggers were dropped by someone with "
                         "write access to the database; run `tidegate timeline verify`")
    return missing
