"""The SQLite timeline's pending log: appended events not yet committed to the database.

Issue 9 "Disk": one SQLite transaction per turn appended ~8 page-sized WAL frames (about
8 KB) for ~0.8 KB of event rows. The writer (``writer.py``) therefore acknowledges a
batch once it is appended here, and commits everything pending to SQLite in one
transaction every ``FLUSH_INTERVAL`` seconds, at ``FLUSH_BYTES``, before an in-process
read and on close. A turn costs its rows once here and its share of one transaction.

File: ``<timeline.db>-pending``, next to the database (like ``-journal``): append-only JSON
lines, one per acknowledged writer batch::

    {"events": [[event_id, session_id, seq, timestamp, event_type, content, prev_hash,
                 hash], ...]}                           # the batch's events, in order

A session's head row follows from its events (the last one's seq, hash and timestamp;
SESSION_CREATE gives session_key and created_at, SESSION_END archives), so it is not
written.

Crash guarantees: a batch is acknowledged only after its whole line was written (a kill
-9 loses nothing acknowledged: the line is in the OS page cache, like an unsynced WAL
commit). Opening the database for writing replays the file in one transaction, skipping
events the database already has (a crash between a commit and the truncation that
follows it), so nothing is applied twice; then truncates it. A torn last line (a crash
mid-write) was never acknowledged and is ignored. Read-only openers (the CLI while the
daemon runs) read the file too (:func:`merged_heads`, :func:`newer_events`), so they see
every acknowledged event.
"""

from __future__ import annotations

import heapq
import json
import os
from dataclasses import dataclass, field

# Seconds (real time: file housekeeping, not agent behaviour). The log is the durable
# record, so the interval costs no durability; a flush's fixed cost (partly filled pages
# rewritten, a checkpoint, two fsyncs) is spread over the turns since the last one.
FLUSH_INTERVAL = 300.0
FLUSH_BYTES = 1 << 20  # pending bytes that trigger a commit before the interval is up

_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def pending_path(db_path: str) -> str:
    """The pending log of the database at ``db_path``."""
    return db_path + "-pending"


@dataclass(slots=True)
class Pending:
    """What a pending log holds: the head row its events lead to (INFO_COLS order;
    session_key and created_at None when the session was created before the log) and the
    events (EVENT_COLS order, seq ascending) per session id; ``torn``: unreadable lines."""

    heads: dict[str, tuple] = field(default_factory=dict)
    events: dict[str, list[tuple]] = field(default_factory=dict)
    torn: int = 0

    def __bool__(self) -> bool:
        return bool(self.heads)


def read_pending(path: str) -> Pending:
    """Parse the pending log at ``path`` (missing file: empty). Unreadable lines are
    counted in ``torn`` and skipped."""
    out = Pending()
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return out
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            events = [tuple(e) for e in json.loads(line)["events"]]
            heads: dict[str, tuple] = {}
            for e in events:
                heads[e[1]] = _advance(heads.get(e[1]) or out.heads.get(e[1]), e)
        except (ValueError, KeyError, TypeError, IndexError):
            out.torn += 1
            continue
        for ev in events:
            out.events.setdefault(ev[1], []).append(ev)
        out.heads.update(heads)
    return out


def _advance(head: tuple | None, ev: tuple) -> tuple:
    """The head row after event ``ev`` (EVENT_COLS order)."""
    sid, seq, ts, etype = ev[1], ev[2], ev[3], ev[4]
    key, created = (head[1], head[3]) if head else (None, None)
    if etype == "SESSION_CREATE":
        key, created = json.loads(ev[5])["session_key"], ts
    ended = etype == "SESSION_END"
    return (sid, key, "archived" if ended else "active", created, ts if ended else None,
            seq, ev[7], ts)


class PendingLog:
    """The writer's append handle on the pending log at ``path`` (created 0600).

    Raises OSError from :meth:`append` / :meth:`reset`; a failed append leaves the file as
    it was (the partial line is cut off again).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.size = os.fstat(self._fd).st_size

    def append(self, events: list[tuple]) -> None:
        """Write one batch (EVENT_COLS rows) as one line."""
        data = (_ENCODE({"events": events}) + "\n").encode()
        view, start = memoryview(data), self.size
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError:
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass  # the torn line is skipped when read
            raise
        self.size += len(data)

    def reset(self) -> None:
        """Empty the file (everything in it is committed to the database)."""
        os.ftruncate(self._fd, 0)
        self.size = 0

    def close(self) -> None:
        os.close(self._fd)


def newer_events(pending: Pending, session_id: str, db_last_seq: int) -> list[tuple]:
    """The session's pending events the database does not have yet (seq > its head)."""
    return [e for e in pending.events.get(session_id, ()) if e[2] > db_last_seq]


def merged_head(pending: Pending, session_id: str, db_head: tuple | None) -> tuple | None:
    """The session's head row: the pending one when it is ahead of the database's (with
    the database's session_key and created_at when the log lacks its creation)."""
    head = pending.heads.get(session_id)
    if head is None or (db_head is not None and head[5] <= db_head[5]):
        return db_head
    if head[1] is None:
        key, created = (db_head[1], db_head[3]) if db_head else ("", 0)
        head = (head[0], key, head[2], created, *head[4:])
    return head


def merged_heads(pending: Pending, db_heads: dict[str, tuple]) -> dict[str, tuple]:
    """Every session's head row: the database's, overridden where pending is ahead."""
    out = dict(db_heads)
    for sid in pending.heads:
        out[sid] = merged_head(pending, sid, db_heads.get(sid))  # type: ignore[assignment]
    return out


def merged_stream(db_rows, pending: Pending, db_heads: dict[str, tuple]):
    """``db_rows`` (events in (session_id, seq) order) with the pending events the
    database lacks slotted in at their place; ``db_heads``: the database's head rows."""
    if not pending:
        yield from db_rows
        return
    extra = sorted((e for sid in pending.events for e in newer_events(
        pending, sid, db_heads[sid][5] if sid in db_heads else 0)),
        key=lambda e: (e[1], e[2]))
    yield from heapq.merge(db_rows, extra, key=lambda e: (e[1], e[2]))
