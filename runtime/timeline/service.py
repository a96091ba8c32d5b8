"""The irreversible per-session timeline: the API the gateway and the turn loop call.

Seed 000 §3.3.2 (init_timeline / append_event / get_timeline) plus verification and
archiving (DESIGN.md "Timeline event"). The gateway holds one :class:`Timeline`; a new
session calls :meth:`Timeline.init_timeline`, every message / tool call / result / beat /
cron run is appended as it happens, and ending the session archives its timeline.

Event content shapes (``content`` is always a JSON object; extra keys are allowed and kept):

- SESSION_CREATE ``{"session_key": str}`` (written by ``init_timeline``)
- USER_INPUT ``{"text": str, "message_id"?: str, "sender"?: str}``
- LLM_RESPONSE ``{"text": str, "tool_calls": [{"id", "name", "arguments": {}}], "model": str,
  "provider": str, "usage": {...}, "stop_reason": str}``
- TOOL_CALL ``{"id": str, "name": str, "arguments": {}}``
- TOOL_RESULT ``{"tool_call_id": str, "name": str, "result": str, "is_error": bool,
  "duration_ms": int}``
- SYSTEM_EVENT ``{"text": str, "source": str, "ts": int ms}``
- HEARTBEAT ``{"outcome": str, "reply"?: str, "duration_ms": int}``
- CRON_RUN ``{"job_id": str, "status": str, ...}``
- OUTCOME ``{"outcome": str, "detail": str, "message_id": str|None, "channel": str,
  "entry_id": str|None, "run_id": str|None}`` (the one outcome of an accepted message)
- COMPACTION ``{"summary": str, "first_kept_entry_id": str, "tokens_before": int}``
- SESSION_END ``{"reason": str}`` (written by ``end_timeline``)

USER_INPUT, LLM_RESPONSE, TOOL_CALL and TOOL_RESULT carry everything needed to rebuild the
transcript messages (``timeline_export.rebuild_transcript_messages``).
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from pathlib import Path
from typing import Any

import structlog

from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.timeline.model import (
    EVENT_TYPES,
    TimelineArchivedError,
    TimelineBusyError,
    TimelineClosedError,
    TimelineError,
    TimelineEvent,
    TimelineExistsError,
    TimelineFencedError,
    TimelineInfo,
    TimelineNotFoundError,
    VerifyReport,
    canonical_content,
)
from runtime.timeline.store import SqliteTimelineStore, TimelineStore

__all__ = [
    "EVENT_TYPES",
    "Timeline",
    "TimelineArchivedError",
    "TimelineBusyError",
    "TimelineClosedError",
    "TimelineError",
    "TimelineEvent",
    "TimelineExistsError",
    "TimelineFencedError",
    "TimelineInfo",
    "TimelineNotFoundError",
    "TimelineTamperedError",
    "VerifyReport",
]

log = structlog.get_logger(__name__)


# Event ids must be unique, not secret: uuid4 from a PRNG seeded with OS entropy (and
# reseeded in a forked child). uuid.uuid4() calls os.urandom, which releases the GIL on
# every call and hands it to the writer thread mid-append: ~20 µs per append under load.
_rng = random.Random()
os.register_at_fork(after_in_child=_rng.seed)


def new_event_id(at_ms: int | None = None) -> str:
    """A UUID string for an event: version 7 (RFC 9562: 48-bit ms timestamp, then random
    bits) when ``at_ms`` is given, so consecutive events land next to each other in the
    event-id index (one index page per transaction instead of one per event: less WAL,
    issue 9 "Disk"); version 4 (random) otherwise."""
    if at_ms is None:
        return str(uuid.UUID(int=_rng.getrandbits(128), version=4))
    value = ((at_ms & (2**48 - 1)) << 80) | (0x7 << 76) | (_rng.getrandbits(12) << 64) \
        | (0b10 << 62) | _rng.getrandbits(62)
    return str(uuid.UUID(int=value))


def _check_id(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


class TimelineTamperedError(TimelineError):
    """A timelines row disagrees with its hash chain (the database was edited)."""


class Timeline:
    """Per-session hash-chained event log over a :class:`TimelineStore`.

    ``clock`` supplies "now" (``clock.time()`` epoch seconds, stored as int ms). All methods
    are coroutines and never block the event loop. Appends to one session are applied in
    call order; the store guarantees gapless seq and non-decreasing timestamps.
    """

    def __init__(self, store: TimelineStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.clock = clock
        self._breaks_logged: set[tuple] = set()  # (session_id, seq, reason) warned about

    @classmethod
    async def open_sqlite(cls, path: str | Path, clock: Clock = SYSTEM_CLOCK, *,
                          readonly: bool = False) -> Timeline:
        """Open the SQLite timeline at ``path`` (default location ``<state_dir>/timeline.db``).

        ``readonly`` opens an existing database for reading only (the CLI; appends raise
        TimelineError). Raises sqlite3.Error when the file cannot be opened or is not a
        database; FileNotFoundError when ``readonly`` and it does not exist.
        """
        store = await asyncio.to_thread(SqliteTimelineStore.open, path, readonly=readonly)
        return cls(store, clock)

    @classmethod
    async def open_postgres(cls, pool: Any, clock: Clock = SYSTEM_CLOCK, *,
                            readonly: bool = False) -> Timeline:
        """The timeline in PostgreSQL over an asyncpg ``pool`` whose schema is migrated
        (``runtime.storage.postgres.pool.open_database``). Raises asyncpg errors."""
        from runtime.storage.postgres.timeline import PgTimelineStore
        return cls(await PgTimelineStore.open(pool, readonly=readonly, clock=clock), clock)

    def _now_ms(self) -> int:
        return int(self.clock.time() * 1000)

    def _ms(self, at: float | None) -> int:
        return self._now_ms() if at is None else int(at * 1000)

    async def init_timeline(self, session_id: str, session_key: str, *,
                            at: float | None = None) -> str:
        """Create the session's timeline with its SESSION_CREATE event (seq 1).

        ``at``: when the session was created (epoch seconds; default now). Returns the
        timeline id, which is the session id (one timeline per session). Raises
        TimelineExistsError if the session already has one; ValueError on empty ids.
        """
        _check_id("session_id", session_id)
        _check_id("session_key", session_key)
        content = canonical_content({"session_key": session_key})
        ev = await self.store.create(session_id, session_key, new_event_id(), self._ms(at),
                                     content)
        log.info("timeline_created", session_id=session_id, session_key=session_key,
                 event_id=ev.event_id)
        return session_id

    async def append_event(self, session_id: str, event_type: str, content: dict[str, Any],
                           *, at: float | None = None) -> TimelineEvent:
        """Append one event and return it (event_id, seq, timestamp ms, prev_hash, hash).

        ``at``: when it happened (epoch seconds; default now), for callers that queue events
        and write them later; the store still never lets timestamps decrease within a
        session. ``content`` must be a JSON object (shapes in the module docstring). SESSION_END
        archives the timeline like :meth:`end_timeline`. Raises ValueError for an unknown
        event type, for SESSION_CREATE (use ``init_timeline``) or content JSON cannot encode;
        TypeError when content is not a dict; TimelineNotFoundError / TimelineArchivedError.
        """
        _check_id("session_id", session_id)
        if event_type not in EVENT_TYPES:
            raise ValueError(
                f"unknown timeline event_type {event_type!r}; expected one of "
                + ", ".join(sorted(EVENT_TYPES)))
        if event_type == "SESSION_CREATE":
            raise ValueError("SESSION_CREATE is written by init_timeline, not append_event")
        text = canonical_content(content)
        return await self.store.append(session_id, new_event_id(), event_type,
                                       self._ms(at), text)

    async def append_events(self, session_id: str,
                            events: list[tuple[str, dict[str, Any] | str, float | None]],
                            *, fence: Any = None) -> list[TimelineEvent | BaseException]:
        """Write several events of one session in ONE transaction (issue 9): ``events`` is
        ``[(event_type, content, at)]``; the pseudo type ``"SESSION_CREATE"`` with the
        session key as content creates the timeline (as :meth:`init_timeline`). Returns per
        event the committed TimelineEvent or the error that refused it
        (TimelineNotFoundError, TimelineArchivedError, ValueError for an unknown event
        type or content that is not a JSON object, ...). ``fence``: the lane lease
        ``(name, replica, generation)`` the write must still hold (PostgreSQL replicas:
        refused with ``TimelineFencedError`` otherwise); None on one host."""
        _check_id("session_id", session_id)
        items: list[tuple[str, str, str, int, str]] = []
        out: list[TimelineEvent | BaseException | None] = []
        key = ""
        for etype, content, at in events:
            try:
                if etype == "SESSION_CREATE":
                    key = _check_id("session_key", content)
                    ms = self._ms(at)
                    item = ("create", new_event_id(ms), etype, ms,
                            canonical_content({"session_key": key}))
                elif etype not in EVENT_TYPES:
                    raise ValueError(f"unknown timeline event_type {etype!r}")
                else:
                    ms = self._ms(at)
                    item = ("append", new_event_id(ms), etype, ms,
                            canonical_content(content))
            except (TypeError, ValueError) as exc:  # this event only: the rest is written
                out.append(exc)
                continue
            items.append(item)
            out.append(None)
        written = iter(await (self.store.append_many(session_id, items, key, fence=fence)
                              if fence is not None else
                              self.store.append_many(session_id, items, key))
                       if items else [])
        return [r if r is not None else next(written) for r in out]

    async def end_timeline(self, session_id: str, reason: str = "ended") -> TimelineEvent:
        """Append SESSION_END ``{"reason": reason}`` and archive; later appends are refused.

        Raises TimelineNotFoundError, TimelineArchivedError (already ended).
        """
        return await self.append_event(session_id, "SESSION_END", {"reason": reason})

    async def get_timeline(
        self,
        session_id: str,
        from_ts: int | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
    ) -> list[TimelineEvent]:
        """The session's events in order (seq ascending, so timestamps are non-decreasing).

        ``from_ts``: only events with timestamp >= from_ts (int ms since the epoch);
        ``after_seq``: only seq > after_seq (resume reading); ``limit``: at most that many.
        Raises TimelineNotFoundError for an unknown session; ValueError for a negative limit.
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        return await self.store.events(session_id, from_ts, after_seq, limit)

    async def verify(self, session_id: str | None = None) -> VerifyReport:
        """Recompute the hash chain of one session, or of every session when None.

        Streams through the store. Returns a :class:`VerifyReport` naming the first broken
        event. Raises TimelineNotFoundError for an unknown session_id. A chain that
        recomputes is logged at DEBUG (the control UI verifies every listed session at each
        page load); a broken one is a WARNING ``timeline_verify_failed`` the first time
        this Timeline finds that break (same session, seq and reason), DEBUG after.
        """
        report = await self.store.verify(session_id)
        if report.ok:
            log.debug("timeline_verified", session_id=session_id,
                      sessions=report.sessions_checked, events=report.events_checked)
        else:
            found = (report.session_id, report.seq, report.reason)
            seen = found in self._breaks_logged
            self._breaks_logged.add(found)
            (log.debug if seen else log.warning)("timeline_verify_failed", session_id=report.session_id, seq=report.seq,
                        event_id=report.event_id, reason=report.reason, detail=report.detail)
        return report

    async def list_timelines(self, *, session_key: str | None = None, status: str | None = None,
                             limit: int | None = None) -> list[TimelineInfo]:
        """Timelines newest first (session_id, session_key, status, created_at/ended_at ms,
        event_count), optionally only one session key or status ("active" | "archived")."""
        if status is not None and status not in ("active", "archived"):
            raise ValueError(f"status must be 'active' or 'archived', got {status!r}")
        return await self.store.timelines(session_key, status, limit)

    async def latest_for_key(self, session_key: str) -> TimelineInfo | None:
        """The most recently created timeline of ``session_key`` (None if it has none)."""
        rows = await self.store.timelines(session_key, None, 1)
        return rows[0] if rows else None

    async def get_info(self, session_id: str) -> TimelineInfo:
        """The session's timeline row. Raises TimelineNotFoundError."""
        info = await self.store.info(session_id)
        if info is None:
            raise TimelineNotFoundError(session_id)
        return info

    async def check_info(self, info: TimelineInfo) -> None:
        """Cheap consistency check of a timelines row against its chain's ends.

        The row is not hashed: with the triggers dropped, its session_key, head or status
        can be edited alone. Compares session_key/created_at with SESSION_CREATE, and the
        head, status and ended_at with the event at ``last_seq``. Full proof is :meth:`verify`.
        Raises TimelineTamperedError naming the disagreement.
        """
        first = await self.store.events(info.session_id, limit=1)
        last = await self.store.events(info.session_id, after_seq=info.event_count - 1,
                                       limit=1) if info.event_count > 0 else []
        problem = None
        if not first or first[0].event_type != "SESSION_CREATE":
            problem = "it has no SESSION_CREATE event"
        elif first[0].content.get("session_key") != info.session_key:
            problem = (f"its SESSION_CREATE says session_key "
                       f"{first[0].content.get('session_key')!r}")
        elif first[0].timestamp != info.created_at:
            problem = f"its SESSION_CREATE is at {first[0].timestamp}, not {info.created_at}"
        elif not last or (last[0].seq, last[0].hash, last[0].timestamp) != (
                info.event_count, info.last_hash, info.last_timestamp):
            problem = "its head (last_seq, last_hash, last_timestamp) is not the chain's"
        elif (last[0].event_type == "SESSION_END") != (info.status == "archived"):
            problem = f"status {info.status!r} contradicts the chain's last event"
        elif info.ended_at != (last[0].timestamp if info.status == "archived" else None):
            problem = f"ended_at {info.ended_at} contradicts the chain's last event"
        if problem:
            raise TimelineTamperedError(
                f"the timelines row of session {info.session_id!r} (session_key "
                f"{info.session_key!r}) disagrees with its hash chain: {problem}; the "
                "database was altered — run `tidegate timeline verify`")

    async def export(self, session_id: str) -> list[str]:
        """Self-verifying JSONL export of the whole session (header line + one per event).

        Lines have no trailing newline; see ``timeline_export.export_jsonl``. The header's
        session_key comes from the row only after :meth:`check_info` passed.
        Raises TimelineNotFoundError, TimelineTamperedError.
        """
        info = await self.get_info(session_id)
        await self.check_info(info)
        events = await self.store.events(session_id)
        from runtime.timeline.export import export_jsonl  # loads with the first export
        return export_jsonl(events, session_key=info.session_key, exported_at=self.clock.time())

    async def close(self) -> None:
        """Flush pending appends and close the store."""
        await self.store.close()

