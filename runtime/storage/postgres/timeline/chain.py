"""Assigning seq, the clamped timestamp, ``prev_hash`` and ``hash`` to a session's new
events from its head (the ``timelines`` row), by the rules the SQLite writer applies
(``runtime/timeline/chain.py``), with :func:`runtime.timeline.model.event_hash_raw` over
the same canonical content text: for the same events the chain is byte-identical on both
backends. Pure functions; the store and the group commit (``batch.py``) write the rows.
"""

from __future__ import annotations

import json
from typing import Any

from runtime.timeline.model import (
    GENESIS_HASH,
    TimelineArchivedError,
    TimelineEvent,
    TimelineExistsError,
    TimelineInfo,
    TimelineNotFoundError,
    event_hash_raw,
)
from runtime.timeline.verify import EVENT_COLS

EVENTS_SQL = EVENT_COLS.replace("timestamp", '"timestamp"')
# An item of ``append_many``: (kind "create" | "append", event_id, event_type, ts ms,
# canonical content JSON)
Item = tuple[str, str, str, int, str]


def event_of(row: Any) -> TimelineEvent:
    """A TimelineEvent from a row in EVENT_COLS order."""
    return TimelineEvent(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]),
                         row[6], row[7])


def info_of(row: Any) -> TimelineInfo:
    return TimelineInfo(*tuple(row))


class Head:
    """A session's chain head: (last_seq, last_hash, last_ts, status); ``new`` when its
    timelines row is not in the database yet (created by these items)."""

    __slots__ = ("created_at", "ended_at", "last_hash", "last_seq", "last_ts", "new",
                 "session_key", "status")

    def __init__(self, last_seq: int, last_hash: str, last_ts: int, status: str, *,
                 new: bool = False, session_key: str = "", created_at: int = 0) -> None:
        self.last_seq, self.last_hash, self.last_ts, self.status = (last_seq, last_hash,
                                                                    last_ts, status)
        self.new, self.session_key, self.created_at = new, session_key, created_at
        self.ended_at: int | None = None

    def key(self) -> tuple[int, str, int]:
        """(last_seq, last_hash, last_ts): what the conditional head update compares."""
        return self.last_seq, self.last_hash, self.last_ts


def chain(head: Head | None, sid: str, items: list[Item], session_key: str
          ) -> tuple[Head | None, list[tuple], list[Any]]:
    """Assign seq/timestamp/prev_hash/hash to ``items`` from ``head`` (moved in place);
    returns (head, event rows in EVENT_COLS order, per item its row or the error that
    refused it: TimelineExistsError, TimelineNotFoundError, TimelineArchivedError)."""
    rows: list[tuple] = []
    results: list[Any] = []
    for kind, eid, etype, ts, content in items:
        if kind == "create":
            if head is not None:
                results.append(TimelineExistsError(sid))
                continue
            head = Head(0, GENESIS_HASH, ts, "active", new=True, session_key=session_key,
                        created_at=ts)
        elif head is None:
            results.append(TimelineNotFoundError(sid))
            continue
        elif head.status != "active":
            results.append(TimelineArchivedError(sid))
            continue
        seq = head.last_seq + 1
        ts = max(head.last_ts, ts)  # never decreasing, as on SQLite
        h = event_hash_raw(eid, sid, seq, ts, etype, content, head.last_hash)
        row = (eid, sid, seq, ts, etype, content, head.last_hash, h)
        rows.append(row)
        head.last_seq, head.last_hash, head.last_ts = seq, h, ts
        if etype == "SESSION_END":
            head.status, head.ended_at = "archived", ts
        results.append(row)
    return head, rows, results
