"""Timeline: a ``timeline.db`` written by the schema before issue 11 (whose event-type
CHECK lacks SUBAGENT_SPAWN / SUBAGENT_ANNOUNCE) is migrated when the gateway opens it:
the new types append, every old chain still verifies, the immutability triggers are back,
and a read-only open (the CLI) leaves the file alone."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from runtime.clock import FakeClock
from runtime.timeline import Timeline
from runtime.timeline.schema import TRIGGERS

T0 = 1_767_225_600.0
KEY = "agent:main:telegram:dm:42"

# The DDL of runtime/timeline/store.py as released before issue 11 (user_version 1).
OLD_DDL = """
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
CREATE TABLE IF NOT EXISTS timeline_events (
    event_id   TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    timestamp  INTEGER NOT NULL,
    event_type TEXT NOT NULL CHECK (event_type IN ('COMPACTION', 'CRON_RUN', 'HEARTBEAT',
        'LLM_RESPONSE', 'SESSION_CREATE', 'SESSION_END', 'SYSTEM_EVENT', 'TOOL_CALL',
        'TOOL_RESULT', 'USER_INPUT')),
    content    TEXT NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL,
    UNIQUE (session_id, seq)
);
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
PRAGMA user_version = 1;
"""
COLS = "event_id, session_id, seq, timestamp, event_type, content, prev_hash, hash"
HEAD = "session_id, session_key, status, created_at, ended_at, last_seq, last_hash, " \
       "last_timestamp"


async def _old_database(tmp_path: Path) -> Path:
    """A timeline.db in the old schema holding two genuine chains (one ended)."""
    scratch = tmp_path / "scratch.db"
    tl = await Timeline.open_sqlite(scratch, clock=FakeClock(T0))
    for sid, end in (("old-active", False), ("old-ended", True)):
        await tl.init_timeline(sid, KEY)
        for i in range(3):
            await tl.clock.advance(1)
            await tl.append_event(sid, "USER_INPUT", {"text": f"{sid} {i}"})
        if end:
            await tl.end_timeline(sid, "user reset")
    await tl.close()
    src = sqlite3.connect(scratch)
    heads = src.execute(f"SELECT {HEAD} FROM timelines").fetchall()
    events = src.execute(f"SELECT {COLS} FROM timeline_events ORDER BY rowid").fetchall()
    src.close()

    db = tmp_path / "timeline.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript(OLD_DDL)
    for h in heads:  # active while its events go in (the insert trigger), then as it was
        conn.execute(f"INSERT INTO timelines ({HEAD}) VALUES (?, ?, 'active', ?, NULL, ?, ?, ?)",
                     (h[0], h[1], h[3], h[5], h[6], h[7]))
    conn.executemany(f"INSERT INTO timeline_events ({COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     events)
    for h in heads:
        if h[2] == "archived":
            conn.execute("UPDATE timelines SET status = 'archived', ended_at = ? "
                         "WHERE session_id = ?", (h[4], h[0]))
    with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint"):
        conn.execute(f"INSERT INTO timeline_events ({COLS}) VALUES "
                     "('x', 'old-active', 5, 0, 'SUBAGENT_SPAWN', '{}', '', '')")
    conn.close()
    return db


def _schema(db: Path) -> tuple[set[str], int, str]:
    conn = sqlite3.connect(db)
    triggers = {r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'timeline_events'"
                       ).fetchone()[0]
    conn.close()
    return triggers, version, sql


async def test_old_schema_is_migrated_and_keeps_chains_and_triggers(tmp_path):
    db = await _old_database(tmp_path)
    conn = sqlite3.connect(db)
    before = conn.execute(f"SELECT {COLS} FROM timeline_events ORDER BY rowid").fetchall()
    conn.close()

    ro = await Timeline.open_sqlite(db, readonly=True)  # the CLI: reads, changes nothing
    assert (await ro.verify()).ok
    await ro.close()
    assert "SUBAGENT_SPAWN" not in _schema(db)[2]

    with capture_logs() as logs:
        tl = await Timeline.open_sqlite(db, clock=FakeClock(T0 + 100))
    [mig] = [x for x in logs if x["event"] == "timeline_schema_migrated"]
    assert mig["added_event_types"] == ["MEMORY_FORGET", "OUTCOME", "SUBAGENT_ANNOUNCE",
                                        "SUBAGENT_SPAWN"]
    assert mig["events"] == len(before)
    assert not [x for x in logs if x["event"] == "timeline_triggers_missing"]

    spawn = await tl.append_event("old-active", "SUBAGENT_SPAWN", {"run_id": "r1"})
    announce = await tl.append_event("old-active", "SUBAGENT_ANNOUNCE", {"run_id": "r1"})
    assert (spawn.seq, announce.seq) == (5, 6)
    assert announce.prev_hash == spawn.hash
    report = await tl.verify()
    assert report.ok, report
    await tl.close()

    conn = sqlite3.connect(db, isolation_level=None)
    after = conn.execute(f"SELECT {COLS} FROM timeline_events ORDER BY rowid").fetchall()
    assert after[: len(before)] == before  # byte for byte, same order
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        conn.execute("UPDATE timeline_events SET content = '{}' WHERE seq = 2")
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        conn.execute("DELETE FROM timeline_events")
    with pytest.raises(sqlite3.IntegrityError, match="archived or unknown"):
        conn.execute(f"INSERT INTO timeline_events ({COLS}) VALUES "
                     "('y', 'old-ended', 5, 0, 'USER_INPUT', '{}', '', '')")
    with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint"):
        conn.execute(f"INSERT INTO timeline_events ({COLS}) VALUES "
                     "('z', 'old-active', 7, 0, 'NOT_A_TYPE', '{}', '', '')")
    conn.close()
    triggers, version, _ = _schema(db)
    assert set(TRIGGERS) <= triggers and version == 2

    with capture_logs() as logs:  # migrated once: the next open is silent
        tl = await Timeline.open_sqlite(db, clock=FakeClock(T0 + 200))
        await tl.close()
    assert not [x for x in logs if x["event"] in ("timeline_schema_migrated",
                                                  "timeline_triggers_missing")]


async def test_a_failed_migration_leaves_the_old_database_intact(tmp_path):
    db = await _old_database(tmp_path)
    conn = sqlite3.connect(db, isolation_level=None)  # a stray table in the copy's name
    conn.execute("CREATE TABLE timeline_events_migrating (event_id TEXT)")
    conn.close()
    with capture_logs() as logs:
        with pytest.raises(sqlite3.Error):
            await Timeline.open_sqlite(db, clock=FakeClock(T0))
    assert not [x for x in logs if x["event"] == "timeline_schema_migrated"]
    triggers, version, sql = _schema(db)
    assert set(TRIGGERS) <= triggers and version == 1 and "SUBAGENT_SPAWN" not in sql
    ro = await Timeline.open_sqlite(db, readonly=True)
    report = await ro.verify()
    await ro.close()
    assert report.ok
