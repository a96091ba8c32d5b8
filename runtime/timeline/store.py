"""Timeline storage: the ``TimelineStore`` protocol and its SQLite implementation.

Implements the storage half of seed 000 §3.3 / DESIGN.md "Timeline event": an append-only
events table guarded by triggers, a per-session head row, and chain verification that
streams through the database.

SQLite specifics (``SqliteTimelineStore``):

- Group commit behind a pending log (issue 9 "Disk"): the writer thread acknowledges a
  batch once it is one line of ``<db>-pending`` (``pending.py``) and commits everything
  pending in ONE transaction every ``FLUSH_INTERVAL`` (300 s), at ``FLUSH_BYTES`` (1 MiB),
  before an in-process read (``flush``) and on close; that commit is fsynced
  (``synchronous=FULL``), then the log is emptied. A killed process (kill -9) loses nothing
  acknowledged: the log line is in the OS page cache and is replayed (once: events the
  database has are skipped) on the next open. A power cut can lose what the kernel had
  not yet written back (its ~30 s dirty-page expiry), never tears a chain: a log line and
  a transaction are each whole or absent. A rollback journal (``schema.JOURNAL_MODE``:
  flushes append, so the rows are written once, not into a WAL and again by its
  checkpoint), 4 KiB pages (new databases). A database still in WAL (made by an older
  version) is converted at the first open that finds it unused elsewhere.
- One writer per database: a writable open takes an exclusive ``flock`` on
  ``<db>.lock`` (``writer.writer_lock``) for the store's life, so a second process (a CLI
  command while the gateway runs) cannot replay and empty the first one's pending log
  under it (TimelineBusyError instead); read-only opens take no lock.
- All database work happens off the event loop. Writes go through one writer thread
  (``writer.py``). Reads (``events``, ``timelines``, ``verify``) run on a small reader
  pool with read-only connections; they wait out a flush's commit (milliseconds, every
  few minutes; ``busy_timeout``), and a long read (a CLI verify of a big timeline) delays
  a flush, whose events stay in the pending log meanwhile. A read-only opener
  (the CLI while the daemon runs) reads the pending log alongside the database, so it
  sees every acknowledged event too.
- Triggers make the events table immutable (UPDATE/DELETE abort), refuse inserts into an
  archived or unknown timeline, refuse any UPDATE of an archived timelines row (so
  un-archiving is impossible), refuse moving a head backwards, refuse changing a row's
  identity (session_id, session_key, created_at) and refuse deleting a timelines row. Only a connection that drops a trigger can change history, and then
  ``verify`` names the changed event — or the altered timelines row: its session_key and
  created_at must match the SESSION_CREATE event, its head (last_seq, last_hash,
  last_timestamp) the chain's last event, and its status/ended_at whether the chain ends
  with SESSION_END. Opening a database whose triggers are gone logs
  ``timeline_triggers_missing`` (a warning) and, unless read-only, recreates them.
- A database whose event-type CHECK predates a new type is migrated when opened for
  writing (``migrate.py``: one-transaction table rebuild, chain and triggers kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import structlog

from runtime.timeline.migrate import migrate_event_types
from runtime.timeline.model import (
    TimelineClosedError,
    TimelineError,
    TimelineEvent,
    TimelineInfo,
    TimelineNotFoundError,
    VerifyReport,
)
from runtime.timeline.pending import (
    Pending,
    merged_head,
    newer_events,
    pending_path,
    read_pending,
)
from runtime.timeline.schema import EVENTS_DDL, SCHEMA, check_triggers, connect
from runtime.timeline.verify import EVENT_COLS, INFO_COLS, verify_rows
from runtime.timeline.writer import Pause, TimelineWriter, writer_lock


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

    async def append_many(
        self, session_id: str, items: list[tuple[str, str, str, int, str]], session_key: str = ""
    ) -> list[TimelineEvent | BaseException]:
        """Create/append several events of one session in ONE transaction; per item the
        committed event or the error that refused it."""

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


_EVENT_COLS, _INFO_COLS = EVENT_COLS, INFO_COLS
log = structlog.get_logger(__name__)


def _row_event(row: tuple) -> TimelineEvent:
    return TimelineEvent(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), row[6], row[7])


def _row_info(row: tuple) -> TimelineInfo:
    return TimelineInfo(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7])


class SqliteTimelineStore:
    """SQLite implementation of :class:`TimelineStore`; see the module docstring.

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
            conn = connect(self.path, readonly=True)
            try:
                self.missing_triggers = check_triggers(conn, self.path, recreate=False)
                self.migrated: list[str] = []  # read-only: an old schema is read as is
            finally:
                conn.close()
        else:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = writer_lock(self.path)  # TimelineBusyError: a gateway writes
            try:
                self._prepare()
            except BaseException:
                os.close(self._lock_fd)
                raise
        self._closed = False
        self._local = threading.local()
        self._rconns: list[sqlite3.Connection] = []
        self._rlock = threading.Lock()
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="timeline-read")
        self._writer: TimelineWriter | None = None
        if not readonly:
            try:
                self._writer = TimelineWriter(lambda: connect(self.path, readonly=False),
                                              self.path, pending_path(self.path))
            except BaseException:
                os.close(self._lock_fd)
                raise
            self._writer.start()

    def _prepare(self) -> None:
        """Triggers, event-type migration and schema of a database opened for writing."""
        conn = connect(self.path, readonly=False)
        try:
            self.missing_triggers = check_triggers(conn, self.path, recreate=True)
            self.migrated = migrate_event_types(conn, self.path, EVENTS_DDL, SCHEMA)
            # one transaction: autocommit would commit (and fsync) every statement,
            # a dozen fsync rounds on a fresh file in rollback-journal mode
            conn.executescript(f"BEGIN;\n{SCHEMA}\nCOMMIT;")
        finally:
            conn.close()

    def pause_writer(self, max_s: float = 10.0) -> Pause | None:
        """Park the writer thread (a backup's cut, ``writer.Pause``); None when read-only."""
        return self._writer.pause(max_s) if self._writer is not None else None

    def problems(self) -> list[str]:
        """What is wrong right now (failing commits), for the gateway's status."""
        return self._writer.problems() if self._writer is not None else []

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

    async def append_many(self, session_id: str, items: list[tuple[str, str, str, int, str]],
                          session_key: str = "") -> list[TimelineEvent | BaseException]:
        """Create/append several events of one session in ONE transaction (``items``:
        ``(kind "create"|"append", event_id, event_type, timestamp_ms, content_json)``).
        Returns, per item, the committed event or the error that refused it."""
        futures = self._writer_or_raise().submit_many(session_id, items, session_key)
        return list(await asyncio.gather(*futures, return_exceptions=True))

    def _rconn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.path, readonly=True)
            self._local.conn = conn
            with self._rlock:
                self._rconns.append(conn)
        return conn

    async def _read(self, fn, *args):
        if self._closed:
            raise TimelineClosedError(f"timeline store {self.path} is closed")
        if self._writer is not None and self._writer.unflushed:
            # In-process readers see SQLite itself; should the commit fail, the pending
            # log is read alongside (``_pending``).
            with contextlib.suppress(sqlite3.Error):
                await self._writer.flush()
        return await asyncio.get_running_loop().run_in_executor(self._readers, fn, *args)

    def _pending(self) -> Pending:
        """The pending log (acknowledged events the database may not have yet): read
        before the database, so together they miss nothing (``pending.py``)."""
        if self._writer is not None and not self._writer.unflushed:
            return Pending()
        return read_pending(pending_path(self.path))

    async def events(self, session_id: str, from_ts: int | None = None,
                     after_seq: int | None = None, limit: int | None = None) -> list[TimelineEvent]:
        return await self._read(self._events_sync, session_id, from_ts, after_seq, limit)

    def _events_sync(self, session_id, from_ts, after_seq, limit) -> list[TimelineEvent]:
        pend = self._pending()
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
        conn.execute("BEGIN")  # one snapshot for the events and the head
        try:
            rows = conn.execute(sql, args).fetchall()
            head = self._db_info(session_id) if pend or not rows else None
        finally:
            conn.execute("COMMIT")
        if pend:
            rows += [e for e in newer_events(pend, session_id, head[5] if head else 0)
                     if (after_seq is None or e[2] > after_seq)
                     and (from_ts is None or e[3] >= from_ts)]
            rows = rows[:limit] if limit is not None else rows
            head = merged_head(pend, session_id, head)
        if not rows and head is None:
            raise TimelineNotFoundError(session_id)
        return [_row_event(r) for r in rows]

    async def timelines(self, session_key: str | None = None, status: str | None = None,
                        limit: int | None = None) -> list[TimelineInfo]:
        return await self._read(self._timelines_sync, session_key, status, limit)

    def _timelines_sync(self, session_key, status, limit) -> list[TimelineInfo]:
        pend = self._pending()
        sql, args, where = f"SELECT {_INFO_COLS} FROM timelines", [], []
        if session_key is not None:
            where.append("session_key = ?")
            args.append(session_key)
        if status is not None and not pend:  # a pending head may change the status
            where.append("status = ?")
            args.append(status)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, rowid DESC"
        if limit is not None and not pend:
            sql += " LIMIT ?"
            args.append(limit)
        rows = self._rconn().execute(sql, args).fetchall()
        if pend:
            seen = {r[0] for r in rows}
            new = [h for sid, h in pend.heads.items() if sid not in seen
                   and (session_key is None or h[1] == session_key)
                   and self._db_info(sid) is None]
            rows = [merged_head(pend, r[0], r) for r in rows]
            # newest first; a session only in the log is newer than any row on a tie
            rows = sorted(new[::-1] + rows, key=lambda r: -r[3])
            rows = [r for r in rows if status is None or r[2] == status][:limit]
        return [_row_info(r) for r in rows]

    async def info(self, session_id: str) -> TimelineInfo | None:
        return await self._read(self._info_sync, session_id)

    def _db_info(self, session_id: str) -> tuple | None:
        return self._rconn().execute(
            f"SELECT {_INFO_COLS} FROM timelines WHERE session_id = ?", (session_id,)).fetchone()

    def _info_sync(self, session_id: str) -> TimelineInfo | None:
        pend = self._pending()
        row = merged_head(pend, session_id, self._db_info(session_id))
        return _row_info(row) if row else None

    async def verify(self, session_id: str | None = None) -> VerifyReport:
        return await self._read(self._verify_sync, session_id)

    def _verify_sync(self, session_id: str | None) -> VerifyReport:
        pend = self._pending()
        conn = self._rconn()
        conn.execute("BEGIN")  # one snapshot: heads and events agree even while appends go on
        try:
            return verify_rows(conn, session_id, pend)
        finally:
            conn.execute("COMMIT")

    async def flush(self) -> None:
        """Commit the acknowledged events still in the pending log to SQLite now (they
        are committed within ``FLUSH_INTERVAL`` anyway). Raises sqlite3.Error."""
        if self._writer is not None and not self._closed:
            await self._writer.flush()

    async def close(self) -> None:
        """Flush queued writes, stop the writer thread and close all connections."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            await asyncio.to_thread(self._writer.stop)
            os.close(self._lock_fd)  # after the last commit: the next writer may open
        await asyncio.to_thread(self._readers.shutdown, True)
        with self._rlock:
            for conn in self._rconns:
                conn.close()
            self._rconns.clear()
