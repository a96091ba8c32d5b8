"""Chaining a batch of timeline writes onto their sessions' heads: seq, the clamped
timestamp, ``prev_hash`` and ``hash`` (:func:`runtime.timeline.model.event_hash_raw`), and
what is refused before anything is written (DESIGN.md "Timeline"). Pure functions of
the requests and the heads; the writer thread (``writer.py``) is the only caller, which
is what serialises appends to a session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.timeline.commit import Head
from runtime.timeline.model import (
    EVENT_TYPES,
    GENESIS_HASH,
    TimelineArchivedError,
    TimelineError,
    TimelineExistsError,
    TimelineNotFoundError,
    event_hash_raw,
)

Result = tuple["Request", Any, "BaseException | None"]


@dataclass(slots=True)
class Request:
    """One queued create/append and the future its caller awaits on ``loop``."""

    kind: str  # "create" | "append"
    session_id: str
    event_id: str
    event_type: str
    timestamp: int
    content_json: str
    session_key: str
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


def chain_batch(batch: list[Request], head_of: Callable[[str], Head | None],
                heads: dict[str, Head], taken: set[str]
                ) -> tuple[list[Result], list[tuple], dict[str, Head]]:
    """Chain the batch's events onto their sessions' heads (in memory).

    ``head_of(sid)``: the session's head (None: no timeline); a created one is put into
    ``heads``. ``taken``: the event ids already used (the batch's are added). Returns one
    ``(request, row, error)`` per request, the rows to write (``(event_id, session_id,
    seq, timestamp, event_type, content_json, prev_hash, hash)``) and the heads they
    lead to."""
    results: list[Result] = []
    rows: list[tuple] = []
    touched: dict[str, Head] = {}
    for req in batch:
        sid = req.session_id
        bad = malformed(req) or (f"event_id {req.event_id!r} is already in the timeline"
                                  if req.event_id in taken else None)
        if bad is not None:  # refused now: SQLite must never refuse a pending row later
            results.append((req, None, TimelineError(f"timeline write refused: {bad}")))
            continue
        head = head_of(sid)
        if req.kind == "create":
            if head is not None:
                results.append((req, None, TimelineExistsError(sid)))
                continue
            head = Head(0, GENESIS_HASH, req.timestamp, "active", True, req.session_key,
                        req.timestamp)
            heads[sid] = head
        elif head is None:
            results.append((req, None, TimelineNotFoundError(sid)))
            continue
        elif head.status != "active":
            results.append((req, None, TimelineArchivedError(sid)))
            continue
        seq = head.last_seq + 1
        # Never decreasing: a wall clock stepped back reuses the last timestamp.
        ts = max(head.last_ts, req.timestamp)
        h = event_hash_raw(req.event_id, sid, seq, ts, req.event_type, req.content_json,
                           head.last_hash)
        ev = (req.event_id, sid, seq, ts, req.event_type, req.content_json,
              head.last_hash, h)
        rows.append(ev)
        head.last_seq, head.last_hash, head.last_ts = seq, h, ts
        if req.event_type == "SESSION_END":
            head.status, head.ended_at = "archived", ts
        touched[sid] = head
        taken.add(req.event_id)
        results.append((req, ev, None))
    return results, rows, touched


def malformed(req: Request) -> str | None:
    """What the database's constraints would refuse in ``req``, or None."""
    if not isinstance(req.event_id, str) or not req.event_id:
        return f"event_id must be a non-empty string, got {req.event_id!r}"
    if req.event_type not in EVENT_TYPES:
        return f"unknown event_type {req.event_type!r}"
    if not isinstance(req.content_json, str):
        return f"content must be JSON text, got {type(req.content_json).__name__}"
    if not isinstance(req.timestamp, int) or isinstance(req.timestamp, bool):
        return f"timestamp must be integer ms, got {req.timestamp!r}"
    if req.kind == "create" and not isinstance(req.session_key, str):
        return f"session_key must be a string, got {req.session_key!r}"
    return None
