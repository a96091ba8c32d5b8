"""Verification of a stored timeline (SQLite or PostgreSQL): every chain, and every timelines row against it.

Used by :class:`runtime.timeline.store.SqliteTimelineStore` (``verify``), inside one read
transaction so heads and events come from one snapshot. The events are streamed through a
:class:`~runtime.timeline.model.ChainChecker` in (session_id, seq) order; after a
session's last event its timelines row is compared column by column with the chain,
because with the triggers dropped the row can be edited without touching a hashed event
(a forged session_key would make ``timeline show``/``export`` present another session's
history as this one's; a flipped status would reopen an ended session).
"""

from __future__ import annotations

import sqlite3

from runtime.timeline.model import ChainChecker, TimelineNotFoundError, VerifyReport
from runtime.timeline.pending import Pending, merged_heads, merged_stream

EVENT_COLS = "event_id, session_id, seq, timestamp, event_type, content, prev_hash, hash"
INFO_COLS = (
    "session_id, session_key, status, created_at, ended_at, last_seq, last_hash, last_timestamp"
)


def _row_problem(checker: ChainChecker, head: tuple) -> tuple[str, int | None, str | None,
                                                             str] | None:
    """How the timelines row ``head`` disagrees with the chain just checked, or None.

    Returns (reason, seq, event_id, detail). Every column is checked: with the triggers
    dropped, the row can be edited without touching a hashed event.
    """
    _, key, status, created_at, ended_at, last_seq, last_hash, last_ts = head
    c = checker
    if (c.last_seq, c.last_hash, c.last_ts) != (last_seq, last_hash, last_ts):
        detail = (f"timelines row says seq {last_seq} hash {last_hash[:12]}… ts {last_ts}, "
                  f"chain ends at seq {c.last_seq} hash {c.last_hash[:12]}… ts {c.last_ts}")
        return "timeline head mismatch", c.last_seq, c.last_event_id, detail
    if key != c.created_key:
        return ("session_key mismatch", 1, c.created_event_id,
                f"timelines row says {key!r}, SESSION_CREATE says {c.created_key!r}")
    if created_at != c.created_ts:
        return ("timeline row mismatch", 1, c.created_event_id,
                f"created_at {created_at} != SESSION_CREATE timestamp {c.created_ts}")
    ended = c.last_type == "SESSION_END"
    if status == "archived" and not ended:
        return ("archived timeline does not end with SESSION_END", c.last_seq,
                c.last_event_id, "")
    if status == "active" and ended:
        return ("active timeline ends with SESSION_END", c.last_seq, c.last_event_id,
                "the timelines row was un-archived")
    if ended_at != (c.last_ts if ended else None):
        return ("timeline row mismatch", c.last_seq, c.last_event_id,
                f"ended_at {ended_at}, expected {c.last_ts if ended else None}")
    return None


class ChainVerifier:
    """Streaming verification over events in (session_id, seq) order, fed one row at a
    time (so a synchronous SQLite cursor and an asynchronous PostgreSQL cursor share it).

    ``heads``: the timelines rows by session_id. ``feed(row)`` returns False once a
    problem is found (stop feeding); ``finish()`` returns the report."""

    def __init__(self, heads: dict[str, tuple], session_id: str | None) -> None:
        self.report = VerifyReport()
        self.heads = heads
        self.session_id = session_id
        self.checker = ChainChecker()
        self.current: str | None = None
        self.seen: set[str] = set()
        self.events = 0
        self.stopped = False

    def _end_session(self) -> bool:
        head = self.heads.get(self.current)
        bad = None if head is None else _row_problem(self.checker, head)
        if bad is not None:
            self.report.fail(bad[0], session_id=self.current, seq=bad[1], event_id=bad[2],
                             detail=bad[3] or None)
            return False
        return True

    def feed(self, row: tuple) -> bool:
        eid, sid, seq, ts, etype, content, prev, h = row
        report = self.report
        if sid != self.current:
            if self.current is not None and not self._end_session():
                self.stopped = True
                return False
            self.current = sid
            self.seen.add(sid)
            report.sessions_checked += 1
            self.checker.start(sid)
            if sid not in self.heads:
                report.fail("event belongs to no timeline", session_id=sid, seq=seq,
                            event_id=eid, detail="no timelines row for this session_id "
                                                 "(altered?)")
                self.stopped = True
                return False
        self.events += 1
        bad = self.checker.check(eid, seq, ts, etype, content, prev, h)
        if bad is not None:
            report.fail(bad[0], session_id=sid, seq=seq, event_id=eid, detail=bad[1])
            self.stopped = True
            return False
        return True

    def finish(self) -> VerifyReport:
        """The report. Raises TimelineNotFoundError for an unknown single session."""
        report = self.report
        if not self.stopped:
            if self.current is not None:
                self._end_session()
            if report.ok:
                for sid in self.heads:
                    if sid not in self.seen:
                        report.fail("timeline has no events", session_id=sid)
                        break
        if self.session_id is not None and not self.heads and not self.seen:
            raise TimelineNotFoundError(self.session_id)
        report.events_checked = self.events
        return report


def verify_rows(conn: sqlite3.Connection, session_id: str | None,
                pending: Pending | None = None) -> VerifyReport:
    """Stream events in (session_id, seq) order through a ChainChecker; O(sessions) memory.
    ``pending``: the pending log's events and heads, checked as if already committed."""
    if session_id is None:
        heads = {r[0]: r for r in conn.execute(f"SELECT {INFO_COLS} FROM timelines")}
        cur = conn.execute(f"SELECT {EVENT_COLS} FROM timeline_events ORDER BY session_id, seq")
    else:
        row = conn.execute(f"SELECT {INFO_COLS} FROM timelines WHERE session_id = ?",
                           (session_id,)).fetchone()
        heads = {row[0]: row} if row else {}
        cur = conn.execute(f"SELECT {EVENT_COLS} FROM timeline_events WHERE session_id = ?"
                           " ORDER BY seq", (session_id,))
    rows = cur
    if pending:
        if session_id is not None:
            pending = Pending({k: v for k, v in pending.heads.items() if k == session_id},
                              {k: v for k, v in pending.events.items() if k == session_id})
        rows = merged_stream(cur, pending, heads)
        heads = merged_heads(pending, heads)
    verifier = ChainVerifier(heads, session_id)
    for row in rows:
        if not verifier.feed(row):
            break
    return verifier.finish()
