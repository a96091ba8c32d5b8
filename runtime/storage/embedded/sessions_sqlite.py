"""SQLite session store: ``<state_dir>/agents/<agent>/sessions/sessions.db``.

One row per session key (a rowid table, ``session_key`` unique), the entry as JSON
(lookups by session id are served from memory). Persisting a change updates that row in
place: its leaf page only (one WAL frame), so its cost does not depend on how many
sessions exist (issue 9; the old ``sessions.json`` was rewritten whole). The first
version was ``WITHOUT ROWID``: an index b-tree keeps at most ~230 bytes of a row in a
1 KiB leaf, so every entry had an overflow page and an update wrote three pages (leaf,
new overflow page, freelist in page 1); such a file is rebuilt once when opened for
writing.

Durability: WAL journal, ``synchronous=NORMAL``, 1 KiB pages (a row update appends about
one 1 KiB frame to the WAL instead of 4 KiB). A commit survives a killed process (the WAL
is in the OS page cache); a power cut can lose the commits since the last checkpoint
(SQLite's automatic one, every 1,000 WAL pages), never tear a transaction.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import structlog

from runtime.storage.sessions import SessionStoreError

log = structlog.get_logger(__name__)

PAGE_SIZE = 1024
_COLUMNS = """(
    session_key TEXT NOT NULL UNIQUE,
    session_id  TEXT NOT NULL,
    entry       TEXT NOT NULL
)"""
_SCHEMA = f"CREATE TABLE IF NOT EXISTS sessions {_COLUMNS};"
_UPSERT = ("INSERT INTO sessions (session_key, session_id, entry) VALUES (?, ?, ?)"
           " ON CONFLICT (session_key) DO UPDATE SET session_id = excluded.session_id,"
           " entry = excluded.entry")
FIX = ("stop the gateway, move the file aside (a new, empty store is created at the next "
       "start; transcripts are kept) or restore it from a backup")


class SqliteSessionRecords:
    """The embedded :class:`runtime.storage.sessions.SessionRecords` backend.

    ``readonly`` opens an existing file for reading (the CLI while the gateway runs).
    Raises SessionStoreError naming ``path`` when the file is not a usable database, or
    FileNotFoundError when ``readonly`` and it does not exist.
    """

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self.rows_written = 0
        self.transactions = 0
        # held by every write: a backup's cut takes it to see no write half-way
        # (gateway/backup/cut.py); writes run on one writer task, so it never contends
        self.lock = threading.Lock()
        try:
            self._conn = self._open(readonly)
        except sqlite3.Error as exc:
            raise SessionStoreError(f"session store {path} is unreadable ({exc})",
                                    path=str(path), fix=FIX) from None

    def _open(self, readonly: bool) -> sqlite3.Connection:
        if readonly:
            if not self.path.exists():
                raise FileNotFoundError(str(self.path))
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                   isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout=5000")
            conn.execute("SELECT count(*) FROM sessions").fetchone()
            return conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # only takes effect on a new file
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        _rebuild_without_rowid(conn, self.path)
        conn.executescript(_SCHEMA)
        return conn

    def load_all(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        bad = 0
        try:
            rows = self._conn.execute("SELECT session_key, entry FROM sessions").fetchall()
        except sqlite3.Error as exc:
            raise SessionStoreError(f"session store {self.path} is unreadable ({exc})",
                                    path=str(self.path), fix=FIX) from None
        for key, raw in rows:
            try:
                value = json.loads(raw)
            except ValueError:
                bad += 1
                continue
            if isinstance(value, dict):
                out[key] = value
        if bad:
            log.warning("session_rows_skipped", path=str(self.path), count=bad)
        return out

    def write(self, upserts: dict[str, dict[str, Any]], deletes: list[str]) -> int:
        with self.lock:
            return self._write(upserts, deletes)

    def _write(self, upserts: dict[str, dict[str, Any]], deletes: list[str]) -> int:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if upserts:
                    conn.executemany(
                        _UPSERT,
                        [(k, str(v.get("session_id", "")),
                          json.dumps(v, ensure_ascii=False, separators=(",", ":")))
                         for k, v in upserts.items()])
                if deletes:
                    conn.executemany("DELETE FROM sessions WHERE session_key = ?",
                                     [(k,) for k in deletes])
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise OSError(f"session store {self.path}: write failed ({exc})") from None
        self.transactions += 1
        self.rows_written += len(upserts) + len(deletes)
        return len(upserts) + len(deletes)

    def close(self) -> None:
        try:
            self._conn.close()
        except sqlite3.Error:
            pass


def _rebuild_without_rowid(conn: sqlite3.Connection, path: Path) -> None:
    """Rebuild a ``WITHOUT ROWID`` sessions table as a rowid table (one transaction)."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table'"
                       " AND name = 'sessions'").fetchone()
    if row is None or "WITHOUT ROWID" not in row[0].upper():
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(f"CREATE TABLE sessions_rebuilt {_COLUMNS}")
        conn.execute("INSERT INTO sessions_rebuilt (session_key, session_id, entry)"
                     " SELECT session_key, session_id, entry FROM sessions")
        conn.execute("DROP TABLE sessions")
        conn.execute("ALTER TABLE sessions_rebuilt RENAME TO sessions")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    log.info("sessions_store_rebuilt", path=str(path), reason="rowid table: an update "
             "writes one page instead of three")
