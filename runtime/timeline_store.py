"""Timeline storage: the ``TimelineStore`` protocol and its SQLite implementation.

Implements the storage half of seed 000 §3.3 / DESIGN.md "Timeline event": an append-only
events table guarded by triggers, a per-session head row, and chain verification that
streams through the database.

SQLite specifics (``SqliteTimelineStore``):

- WAL journal, ``synchronous=NORMAL``: a commit is not fsynced, the WAL is at checkpoint.
  That survives a killed process (the WAL is in the OS page cache and is replayed on the
  next open); a power loss may drop the last few hundred ms of commits but never tears a
  chain, because every batch is one transaction.
- All database work happens off the event loop. Writes go through one writer thread
  (``timeline_writer.py``) that commits whatever queued up as one transaction. Reads
  (``events``, ``timelines``, ``verify``) run on a small reader pool with read-only
  connections, so they never wait for the writer (WAL readers see the last commit).
- Triggers make the events table immutable (UPDATE/DELETE abort), refuse inserts into an
  archived or unknown timeline, refuse any UPDATE of an archived timelines row (so
  un-archiving is impossible), refuse moving a head backwards and refuse deleting a
  timelines row. Only a connection that drops a trigger can change history, and then
  ``verify`` names the changed event.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from runtime.timeline_model import (
    EVENT_TYPES,
    ChainChecker,
    TimelineClosedError,
    TimelineError,
    TimelineEvent,
    TimelineInfo,
    TimelineNotFoundError,
    VerifyReport,
)
from runtime.timeline_writer import TimelineWriter


class TimelineStore(Protocol):
    """What :class:`runtime.timeline.Timeline` needs from storage (SQLite now, PostgreSQL later).

    The store owns the chain: it assigns ``seq``, clamps ``timestamp`` (ms) so it never
    decreases within a session, links ``prev_hash`` and computes ``hash``, atomically with
    the write. ``content_json`` is already canonical JSON (``canonical_content``).
    """

    async def create(
        self, session_id: str, session_key: str, event_id: str, timestamp: int, content_json: str
    ) -> TimelineEvent:
        """Create the timeline with its SESSION_CREATE event (seq 1).

        Raises TimelineExistsError."""

    async def append(
        self, session_id: str, event_id: str, event_type: str, timestamp: int, content_json: str
    ) -> TimelineEvent:
        """Append one event; SESSION_END also archives the timeline.

        Raises TimelineNotFoundError, TimelineArchivedError."""

    async def events(
        self,
        session_id: str,
        from_ts: int | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
    ) -> list[TimelineEvent]:
        """Events in seq order (timestamp >= from_ts ms, seq > after_seq, at most limit).

        Raises TimelineNotFoundError when the session has no timeline."""

    async def timelines(
        self, session_key: str | None = None, status: str | None = None, limit: int | None = None
    ) -> list[TimelineInfo]:
        """Timeline rows, newest first, optionally filtered by session key and status."""

    async def info(self, session_id: str) -> TimelineInfo | None:
        """The session's timeline row, or None."""

    async def verify(self, session_id: str | None = None) -> VerifyReport:
        """Recompute the chain of one session (or all); stream, don't load everything.

        Raises TimelineNotFoundError for an unknown session_id."""

    async def close(self) -> None:
        """Finish queued writes and release connections."""


_TYPES_SQL = ", ".join(f"'{t}'" for t in sorted(EVENT_TYPES))
_SCHEMA = f"""
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
    event_type TEXT NOT NULL CHECK (event_type IN ({_TYPES_SQL})),
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
"""

_EVENT_COLS = "event_id, session_id, seq, timestamp, event_type, content, prev_hash, hash"
_INFO_COLS = (
    "session_id, session_key, status, created_at, ended_at, last_seq, last_hash, last_timestamp"
)


def _connect(path: str, *, readonly: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA busy_timeout=30000")
    if readonly:
        conn.execute("PRAGMA query_only=ON")
    else:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA wal_autocheckpoint=0")
    return conn


def _row_event(row: tuple) -> TimelineEvent:
    return TimelineEvent(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), row[6], row[7])


def _row_info(row: tuple) -> TimelineInfo:
    return TimelineInfo(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7])


class SqliteTimelineStore:
    """SQLite (WAL) implementation of :class:`TimelineStore`; see the module docstring.

    Construct with :meth:`open` (blocking: creates the file and schema, starts the writer
    thread). ``path`` is the database file, by default ``<state_dir>/timeline.db``.
    ``readonly=True`` (the CLI, reading while the daemon writes) opens an existing database
    without touching its schema and starts no writer: ``create``/``append`` raise
    TimelineError.
    """

    def __init__(self, path: str | Path, *, readers: int = 2, readonly: bool = False) -> None:
        self.path = str(path)
        self.readonly = readonly
        if readonly:
            if not Path(self.path).is_file():
                raise FileNotFoundError(f"no timeline database at {self.path}")
            _connect(self.path, readonly=True).close()
        else:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = _connect(self.path, readonly=False)
            try:
                conn.executescript(_SCHEMA)
            finally:
                conn.close()
        self._closed = False
        self._local = threading.local()
        self._rconns: list[sqlite3.Connection] = []
        self._rlock = threading.Lock()
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="timeline-read")
        self._writer: TimelineWriter | None = None
        if not readonly:
            self._writer = TimelineWriter(lambda: _connect(self.path, readonly=False), self.path)
            self._writer.start()

    @classmethod
    def open(cls, path: str | Path, *, readonly: bool = False) -> SqliteTimelineStore:
        """Open the database at ``path`` (created if needed unless ``readonly``).

        Raises sqlite3.Error; FileNotFoundError when ``readonly`` and the file is missing.
        """
        return cls(path, readonly=readonly)

    def _writer_or_raise(self) -> TimelineWriter:
        if self._writer is None:
            raise TimelineError(f"timeline store {self.path} is open read-only")
        return self._writer

    async def create(self, session_id: str, session_key: str, event_id: str, timestamp: int,
                     content_json: str) -> TimelineEvent:
        return await self._writer_or_raise().submit(
            "create", session_id, event_id, "SESSION_CREATE", timestamp, content_json,
            session_key)

    async def append(self, session_id: str, event_id: str, event_type: str, timestamp: int,
                     content_json: str) -> TimelineEvent:
        return await self._writer_or_raise().submit(
            "append", session_id, event_id, event_type, timestamp, content_json)

    # ---- reads --------------------------------------------------------------------------

    def _rconn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path, readonly=True)
            self._local.conn = conn
            with self._rlock:
                self._rconns.append(conn)
        return conn

    async def _read(self, fn, *args):
        if self._closed:
            raise TimelineClosedError(f"timeline store {self.path} is closed")
        return await asyncio.get_running_loop().run_in_executor(self._readers, fn, *args)

    async def events(self, session_id: str, from_ts: int | None = None,
                     after_seq: int | None = None, limit: int | None = None) -> list[TimelineEvent]:
        return await self._read(self._events_sync, session_id, from_ts, after_seq, limit)

    def _events_sync(self, session_id, from_ts, after_seq, limit) -> list[TimelineEvent]:
        conn = self._rconn()
        sql = f"SELECT {_EVENT_COLS} FROM timeline_events WHERE session_id = ?"
        args: list[Any] = [session_id]
        if after_seq is not None:
            sql += " AND seq > ?"
            args.append(after_seq)
        if from_ts is not None:
            sql += " AND timestamp >= ?"
            args.append(from_ts)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        out = [_row_event(r) for r in conn.execute(sql, args)]
        if not out and self._info_sync(session_id) is None:
            raise TimelineNotFoundError(session_id)
        return out

    async def timelines(self, session_key: str | None = None, status: str | None = None,
                        limit: int | None = None) -> list[TimelineInfo]:
        return await self._read(self._timelines_sync, session_key, status, limit)

    def _timelines_sync(self, session_key, status, limit) -> list[TimelineInfo]:
        sql, args, where = f"SELECT {_INFO_COLS} FROM timelines", [], []
        if session_key is not None:
            where.append("session_key = ?")
            args.append(session_key)
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, rowid DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [_row_info(r) for r in self._rconn().execute(sql, args)]

    async def info(self, session_id: str) -> TimelineInfo | None:
        return await self._read(self._info_sync, session_id)

    def _info_sync(self, session_id: str) -> TimelineInfo | None:
        row = self._rconn().execute(
            f"SELECT {_INFO_COLS} FROM timelines WHERE session_id = ?", (session_id,)).fetchone()
        return _row_info(row) if row else None

    async def verify(self, session_id: str | None = None) -> VerifyReport:
        return await self._read(self._verify_sync, session_id)

    def _verify_sync(self, session_id: str | None) -> VerifyReport:
        conn = self._rconn()
        conn.execute("BEGIN")  # one snapshot: heads and events agree even while appends go on
        try:
            return _verify_rows(conn, session_id)
        finally:
            conn.execute("COMMIT")

    async def close(self) -> None:
        """Flush queued writes, stop the writer thread and close all connections."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            await asyncio.to_thread(self._writer.stop)
        await asyncio.to_thread(self._readers.shutdown, True)
        with self._rlock:
            for conn in self._rconns:
                conn.close()
            self._rconns.clear()


def _verify_rows(conn: sqlite3.Connection, session_id: str | None) -> VerifyReport:
    """Stream events in (session_id, seq) order through a ChainChecker; O(sessions) memory."""
    report = VerifyReport()
    if session_id is None:
        heads = {r[0]: r for r in conn.execute(
            "SELECT session_id, last_seq, last_hash, status FROM timelines")}
        cur = conn.execute(f"SELECT {_EVENT_COLS} FROM timeline_events ORDER BY session_id, seq")
    else:
        row = conn.execute("SELECT session_id, last_seq, last_hash, status FROM timelines"
                           " WHERE session_id = ?", (session_id,)).fetchone()
        heads = {row[0]: row} if row else {}
        cur = conn.execute(f"SELECT {_EVENT_COLS} FROM timeline_events WHERE session_id = ?"
                           " ORDER BY seq", (session_id,))
    checker = ChainChecker()
    current: str | None = None
    seen: set[str] = set()
    events = 0

    def finish() -> bool:
        head = heads.get(current)
        if head is None:
            return True
        if (checker.last_seq, checker.last_hash) != (head[1], head[2]):
            report.fail("timeline head mismatch", session_id=current, seq=checker.last_seq,
                        event_id=checker.last_event_id,
                        detail=f"timelines row says seq {head[1]} hash {head[2][:12]}…, chain "
                               f"ends at seq {checker.last_seq} hash {checker.last_hash[:12]}…")
            return False
        if head[3] == "archived" and checker.last_type != "SESSION_END":
            report.fail("archived timeline does not end with SESSION_END", session_id=current,
                        seq=checker.last_seq, event_id=checker.last_event_id)
            return False
        return True

    for eid, sid, seq, ts, etype, content, prev, h in cur:
        if sid != current:
            if current is not None and not finish():
                break
            current = sid
            seen.add(sid)
            report.sessions_checked += 1
            checker.start(sid)
            if sid not in heads:
                report.fail("event belongs to no timeline", session_id=sid, seq=seq, event_id=eid,
                            detail="no timelines row for this session_id (altered?)")
                break
        events += 1
        bad = checker.check(eid, seq, ts, etype, content, prev, h)
        if bad is not None:
            report.fail(bad[0], session_id=sid, seq=seq, event_id=eid, detail=bad[1])
            break
    else:
        if current is not None:
            finish()
        if report.ok:
            for sid in heads:
                if sid not in seen:
                    report.fail("timeline has no events", session_id=sid)
                    break
    if session_id is not None and not heads and not seen:
        raise TimelineNotFoundError(session_id)
    report.events_checked = events
    return report
