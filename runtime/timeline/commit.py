"""Writing event rows and chain heads into the SQLite timeline, and replaying the pending
log (``pending.py``) into it after a crash.

Used by the writer thread (``writer.py``): the flush of everything pending and the replay
at open both go through :func:`store_rows`, in one transaction each.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass

import structlog

from runtime.timeline.model import GENESIS_HASH
from runtime.timeline.pending import Pending, merged_head, newer_events, read_pending

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Head:
    """Writer-side state of a session's chain head (the timelines row)."""

    last_seq: int
    last_hash: str
    last_ts: int
    status: str
    new: bool = False  # its timelines row is not in the database yet
    session_key: str = ""
    created_at: int = 0
    ended_at: int | None = None

    def row(self, session_id: str) -> tuple:
        """The timelines row (INFO_COLS order)."""
        return (session_id, self.session_key, self.status, self.created_at, self.ended_at,
                self.last_seq, self.last_hash, self.last_ts)


def load_head(conn: sqlite3.Connection, session_id: str) -> Head | None:
    """The session's head as the database has it, or None."""
    row = conn.execute(
        "SELECT last_seq, last_hash, last_timestamp, status, session_key, created_at,"
        " ended_at FROM timelines WHERE session_id = ?", (session_id,)).fetchone()
    if row is None:
        return None
    return Head(row[0], row[1], row[2], row[3], False, row[4], row[5], row[6])


def store_rows(conn: sqlite3.Connection, rows: list[tuple], heads: dict[str, Head]) -> None:
    """Insert ``rows`` (EVENT_COLS order) and write the ``heads`` they lead to, inside the
    caller's transaction."""
    # Few statements, each covering many rows: every sqlite3 call drops and retakes the
    # GIL, and retaking it while the event loop is busy can cost a switch interval (5 ms).
    new = [(sid, h.session_key, h.created_at, h.last_seq, h.last_hash, h.last_ts)
           for sid, h in heads.items() if h.new]
    old = [(sid, h.last_seq, h.last_hash, h.last_ts) for sid, h in heads.items() if not h.new]
    # The timelines row must exist and be active before its events (insert trigger).
    _many(conn, "INSERT INTO timelines (session_id, session_key, status, created_at,"
          " ended_at, last_seq, last_hash, last_timestamp) VALUES ",
          "(?, ?, 'active', ?, NULL, ?, ?, ?)", new)
    _many(conn, "UPDATE timelines SET last_seq = v.column2, last_hash = v.column3,"
          " last_timestamp = v.column4 FROM (VALUES ", "(?, ?, ?, ?)", old,
          ") AS v WHERE timelines.session_id = v.column1")
    _many(conn, "INSERT INTO timeline_events (event_id, session_id, seq, timestamp,"
          " event_type, content, prev_hash, hash) VALUES ", "(?, ?, ?, ?, ?, ?, ?, ?)", rows)
    ended = [(h.ended_at, sid) for sid, h in heads.items() if h.status == "archived"]
    if ended:  # after the events: SESSION_END itself needs the row still active
        conn.executemany("UPDATE timelines SET status = 'archived', ended_at = ?"
                         " WHERE session_id = ?", ended)


def in_transaction(conn: sqlite3.Connection, rows: list[tuple], heads: dict[str, Head]) -> None:
    """:func:`store_rows` as one transaction. Raises sqlite3.Error (rolled back)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        store_rows(conn, rows, heads)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _many(conn: sqlite3.Connection, head: str, row_sql: str, rows: list[tuple],
          tail: str = "", chunk: int = 400) -> None:
    """Run ``head + row_sql, row_sql, ... + tail`` over ``rows`` in chunks (<= 3,200 params)."""
    for i in range(0, len(rows), chunk):
        part = rows[i:i + chunk]
        conn.execute(head + ",".join([row_sql] * len(part)) + tail,
                     [v for row in part for v in row])


def _chain_problem(db: Head | None, events: list[tuple]) -> str | None:
    """Why ``events`` do not continue the database's chain ``db``, or None."""
    seq, prev = (db.last_seq, db.last_hash) if db else (0, GENESIS_HASH)
    for ev in events:
        if ev[2] != seq + 1 or ev[6] != prev:
            return f"event seq {ev[2]} does not follow seq {seq} (hash {prev[:12]}…)"
        seq, prev = ev[2], ev[7]
    return None


def _replay_plan(conn: sqlite3.Connection, pending: Pending) -> tuple[list, dict, list]:
    rows: list[tuple] = []
    heads: dict[str, Head] = {}
    problems: list[str] = []
    for sid in pending.heads:
        db = load_head(conn, sid)
        events = newer_events(pending, sid, db.last_seq if db else 0)
        if not events:
            continue  # already committed (a crash between the commit and the truncation)
        bad = _chain_problem(db, events)
        if bad is not None:
            problems.append(f"session {sid}: {bad}")
            continue
        head = merged_head(pending, sid, db.row(sid) if db else None)
        rows += events
        heads[sid] = Head(head[5], head[6], head[7], head[2], db is None, head[1], head[3],
                          head[4])
    return rows, heads, problems


def replay_pending(conn: sqlite3.Connection, path: str) -> dict[str, Head]:
    """Commit what the pending log at ``path`` holds and the database lacks (one
    transaction), then empty the log. A log that contradicts the database is kept aside as
    ``<path>.corrupt-<stamp>`` (no byte is destroyed) with an ERROR. Returns the heads
    written. Raises sqlite3.Error / OSError when the database cannot be written."""
    pending = read_pending(path)
    if pending.torn:
        log.warning("timeline_pending_torn", path=path, lines=pending.torn,
                    repair="a batch cut off by a crash was never acknowledged; ignored")
    rows, heads, problems = _replay_plan(conn, pending) if pending else ([], {}, [])
    if rows:
        in_transaction(conn, rows, heads)
        log.info("timeline_pending_replayed", path=path, events=len(rows),
                 sessions=len(heads))
    if problems:
        aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
        os.replace(path, aside)
        log.error("state_file_corrupt", owner="timeline pending log", path=path,
                  error="; ".join(problems[:5]), effect="the events of these sessions that "
                  "were not yet in timeline.db are not replayed; the others are",
                  fix=f"kept as {aside}; compare it with `tidegate timeline verify`")
    elif os.path.exists(path):
        os.truncate(path, 0)
    return heads
