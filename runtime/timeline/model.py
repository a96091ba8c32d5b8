"""Timeline event model: event types, canonical hashing and chain checking (pure code).

A timeline is one session's irreversible, hash-chained event log (seed 000 §3.3.1,
DESIGN.md "Timeline event"). Each event links to the previous one by ``prev_hash``; the
first event (seq 1, always SESSION_CREATE) links to :data:`GENESIS_HASH`.

Canonical form (what ``hash`` covers). ``hash`` is the lower-case SHA-256 hex digest of the
UTF-8 bytes of::

    json.dumps({"content": content, "event_id": event_id, "event_type": event_type,
                "prev_hash": prev_hash, "seq": seq, "session_id": session_id,
                "timestamp": timestamp},
               sort_keys=True, separators=(",", ":"), ensure_ascii=False)

that is, every field of the event except ``hash`` itself, keys sorted, no whitespace,
non-ASCII characters kept as UTF-8. ``seq`` and ``timestamp`` (ms since the epoch) are JSON
integers; ``content`` is a JSON object. There is no format version field: the field set and
this encoding *are* the format, and a change to either would be a new event type, not a new
encoding. Stores keep ``content`` as exactly this canonical JSON text, so the hash can be
recomputed from the stored bytes without re-encoding (see :func:`event_hash_raw`).

This module does no I/O; the store (``store.py``), the export helpers
(``export.py``) and the :class:`~runtime.timeline.Timeline` API share it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from json.encoder import encode_basestring  # what json.dumps(str, ensure_ascii=False) uses
from typing import Any

GENESIS_HASH = "0" * 64
"""``prev_hash`` of seq 1: 64 zeros (no previous event)."""

EVENT_TYPES: frozenset[str] = frozenset(
    {
        "SESSION_CREATE",
        "USER_INPUT",
        "LLM_RESPONSE",
        "TOOL_CALL",
        "TOOL_RESULT",
        "SYSTEM_EVENT",
        "HEARTBEAT",
        "CRON_RUN",
        "COMPACTION",
        "SUBAGENT_SPAWN",
        "SUBAGENT_ANNOUNCE",
        "MEMORY_FORGET",
        "OUTCOME",
        "SESSION_END",
    }
)
"""Every event type a timeline accepts (seed 000 §3.3.1 plus DESIGN.md's additions)."""


class TimelineError(Exception):
    """Base class of timeline errors."""


class TimelineNotFoundError(TimelineError, LookupError):
    """The session has no timeline (``init_timeline`` was never called for it)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"no timeline for session {session_id!r} (call init_timeline first)")
        self.session_id = session_id


class TimelineArchivedError(TimelineError):
    """The session's timeline has ended (SESSION_END) and is archived: no more appends."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"timeline of session {session_id!r} is archived (SESSION_END recorded); "
            "appends are refused"
        )
        self.session_id = session_id


class TimelineFencedError(TimelineError):
    """The append carried a lane lease generation that is no longer current: another
    replica took the session's lane over; nothing was written (replicas on PostgreSQL,
    runtime/storage/postgres/fence.py)."""


class TimelineExistsError(TimelineError):
    """``init_timeline`` was called twice for one session."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already has a timeline")
        self.session_id = session_id


class TimelineClosedError(TimelineError):
    """The store was closed; nothing more can be written or read."""


class TimelineBusyError(TimelineError):
    """Another process (a running gateway) has the SQLite timeline open for writing: only
    one writer may own its pending log (runtime/timeline/writer.py ``writer_lock``)."""


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One timeline event.

    ``timestamp`` is int milliseconds since the epoch (UTC), never decreasing within a
    session; ``seq`` is 1-based and gapless per session; ``content`` is a JSON object whose
    shape depends on ``event_type`` (documented in ``runtime/timeline/service.py``).
    """

    event_id: str
    session_id: str
    seq: int
    timestamp: int
    event_type: str
    content: dict[str, Any]
    prev_hash: str
    hash: str

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (the export line shape)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class TimelineInfo:
    """One row of the timelines table: a session's timeline and its head.

    ``created_at``/``ended_at`` are ms since the epoch (``ended_at`` None while active);
    ``event_count`` equals ``last_seq`` because seq is gapless.
    """

    session_id: str
    session_key: str
    status: str  # "active" | "archived"
    created_at: int
    ended_at: int | None
    event_count: int
    last_hash: str
    last_timestamp: int


@dataclass(slots=True)
class VerifyReport:
    """Result of a chain verification.

    ``ok`` is False when something is broken; then ``session_id``/``seq``/``event_id``
    name the first broken event (``line`` is the 1-based file line for export files) and
    ``reason`` is one of: ``"hash mismatch"``, ``"prev_hash does not match previous
    event"``, ``"seq gap: expected N, got M"``, ``"timestamp decreased"``, ``"timeline
    head mismatch"``, ``"event belongs to no timeline"``, ``"timeline has no events"``,
    ``"unknown event_type"``, ``"misplaced SESSION_CREATE"``, ``"event after
    SESSION_END"``, ``"archived timeline does not end with SESSION_END"``, ``"active
    timeline ends with SESSION_END"``, ``"session_key mismatch"`` (timelines row or export
    header vs the SESSION_CREATE content), ``"timeline row mismatch"`` (created_at /
    ended_at vs the chain), ``"invalid event"`` or ``"invalid export
    header"``/``"count mismatch"``/``"head_hash mismatch"`` for exports. ``detail`` adds
    the specifics (expected vs found values).
    """

    ok: bool = True
    sessions_checked: int = 0
    events_checked: int = 0
    session_id: str | None = None
    seq: int | None = None
    event_id: str | None = None
    reason: str | None = None
    detail: str | None = None
    line: int | None = None

    def fail(
        self,
        reason: str,
        *,
        session_id: str | None = None,
        seq: int | None = None,
        event_id: str | None = None,
        detail: str | None = None,
        line: int | None = None,
    ) -> VerifyReport:
        """Record the first failure (later calls are ignored) and return self."""
        if self.ok:
            self.ok = False
            self.reason, self.detail, self.line = reason, detail, line
            self.session_id, self.seq, self.event_id = session_id, seq, event_id
        return self

    def __str__(self) -> str:
        counts = (f"{self.sessions_checked} session{'' if self.sessions_checked == 1 else 's'}, "
                  f"{self.events_checked} event{'' if self.events_checked == 1 else 's'}")
        if self.ok:
            return f"OK: {counts} verified"
        where = f"session {self.session_id} seq {self.seq} event {self.event_id}"
        if self.line is not None:
            where = f"line {self.line}: " + where
        extra = f" ({self.detail})" if self.detail else ""
        return f"BROKEN at {where}: {self.reason}{extra} [{counts} checked]"


def canonical_content(content: Any) -> str:
    """Canonical JSON text of an event's ``content`` (must be a JSON object).

    Raises TypeError when ``content`` is not a dict; ValueError when it holds values JSON
    cannot encode or NaN/Infinity.
    """
    if not isinstance(content, dict):
        raise TypeError(
            f"timeline content must be a JSON object (dict), got {type(content).__name__}")
    try:
        return json.dumps(
            content, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"timeline content is not JSON-serialisable: {exc}") from exc


def event_hash_raw(
    event_id: str,
    session_id: str,
    seq: int,
    timestamp: int,
    event_type: str,
    content_json: str,
    prev_hash: str,
) -> str:
    """SHA-256 hex of the canonical form, with ``content`` given as its canonical JSON text.

    Builds the same bytes as the ``json.dumps`` in the module docstring without re-encoding
    ``content`` (keys are spliced in sorted order). When ``content_json`` is not canonical
    the result simply differs from the stored hash, which is what tamper detection wants.
    """
    text = (
        f'{{"content":{content_json},"event_id":{encode_basestring(event_id)},'
        f'"event_type":{encode_basestring(event_type)},"prev_hash":{encode_basestring(prev_hash)},'
        f'"seq":{int.__repr__(seq)},"session_id":{encode_basestring(session_id)},'
        f'"timestamp":{int.__repr__(timestamp)}}}'
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def event_hash(event: TimelineEvent | dict[str, Any]) -> str:
    """SHA-256 hex of an event (object or dict with the event fields); ``hash`` is ignored.

    Raises TypeError/ValueError for bad ``content`` (see ``canonical_content``); KeyError
    when a field is missing.
    """
    d = event.to_dict() if isinstance(event, TimelineEvent) else event
    return event_hash_raw(
        d["event_id"], d["session_id"], d["seq"], d["timestamp"], d["event_type"],
        canonical_content(d["content"]), d["prev_hash"],
    )


class ChainChecker:
    """Incremental chain verification, fed one event at a time in (session, seq) order.

    Used by the store's ``verify`` (streaming rows from the database) and by
    ``verify_export_file`` (streaming lines), so both apply the same rules. Memory is O(1).
    Call :meth:`start` for each session, :meth:`check` for each of its events in seq order;
    ``check`` returns ``None`` or ``(reason, detail)`` for the first rule the event breaks.
    Rule order: seq continuity, prev_hash link, timestamp order, hash, then event-type
    placement (so a tampered field is named by the most specific reason).
    """

    __slots__ = ("created_event_id", "created_key", "created_ts", "last_event_id", "last_hash",
                 "last_seq", "last_ts", "last_type", "session_id")

    def __init__(self) -> None:
        self.start(None)

    def start(self, session_id: str | None, *, first_seq: int = 1,
              prev_hash: str = GENESIS_HASH) -> None:
        """Begin a session's chain (a partial export starts at ``first_seq`` after
        ``prev_hash``)."""
        self.session_id = session_id
        self.last_seq = first_seq - 1
        self.last_hash = prev_hash
        self.last_ts: int | None = None
        self.last_type: str | None = None
        self.last_event_id: str | None = None
        # From the chain's SESSION_CREATE (hash-covered): what the timelines row and an
        # export header must agree with. None until seq 1 was checked.
        self.created_key: str | None = None
        self.created_ts: int | None = None
        self.created_event_id: str | None = None

    def check(
        self,
        event_id: str,
        seq: Any,
        timestamp: Any,
        event_type: str,
        content_json: str,
        prev_hash: str,
        stored_hash: str,
    ) -> tuple[str, str | None] | None:
        """Check one event against the chain so far and advance; see class docstring."""
        if type(seq) is not int or type(timestamp) is not int:
            return "invalid event", f"seq/timestamp must be integers: {seq!r}, {timestamp!r}"
        expected = self.last_seq + 1
        if seq != expected:
            return f"seq gap: expected {expected}, got {seq}", None
        if prev_hash != self.last_hash:
            return "prev_hash does not match previous event", (
                f"prev_hash {str(prev_hash)[:12]}…, previous hash {self.last_hash[:12]}…"
            )
        if self.last_ts is not None and timestamp < self.last_ts:
            return "timestamp decreased", f"{timestamp} < {self.last_ts}"
        try:
            computed = event_hash_raw(
                event_id, self.session_id or "", seq, timestamp, event_type, content_json, prev_hash
            )
        except (TypeError, AttributeError) as exc:
            return "invalid event", f"cannot hash: {exc}"
        if computed != stored_hash:
            return "hash mismatch", f"stored {str(stored_hash)[:12]}…, computed {computed[:12]}…"
        if event_type not in EVENT_TYPES:
            return "unknown event_type", repr(event_type)
        if (seq == 1) != (event_type == "SESSION_CREATE"):
            return "misplaced SESSION_CREATE", "seq 1 and only seq 1 is SESSION_CREATE"
        if self.last_type == "SESSION_END":
            return "event after SESSION_END", None
        if seq == 1:
            try:
                key = json.loads(content_json).get("session_key")
            except (ValueError, AttributeError):  # hashed fine, but not an object
                key = None
            self.created_key = key if isinstance(key, str) else None
            self.created_ts, self.created_event_id = timestamp, event_id
        self.last_seq, self.last_hash, self.last_ts = seq, stored_hash, timestamp
        self.last_type, self.last_event_id = event_type, event_id
        return None
