"""The session store: session key -> entry, one ``sessions.json`` per agent.

File: ``<state_dir>/agents/<agent>/sessions/sessions.json``, a JSON object
``{"version": 1, "sessions": {<session_key>: entry}}``; each entry has ``session_id``,
``agent``, ``created_at``, ``updated_at``, ``last_active_at`` (RFC 3339 UTC), ``last_route``
(channel, account, to, thread) and ``counters``. Writes are atomic (temp file + fsync +
rename, under an fcntl lock so the CLI and the daemon never interleave); the daemon keeps
the authoritative copy in memory and coalesces routine updates (at most one write per
``flush_interval``), while creating or resetting a session is written before the call
returns. Reset policy (issue 2 §5): ``none`` | ``daily`` (``at_hour`` in the user's
timezone) | ``idle`` (``idle_minutes``); only user activity counts (heartbeat and cron
turns never roll or refresh a session).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import structlog
from pydantic.alias_generators import to_camel

from runtime.clock import SYSTEM_CLOCK, Clock, parse_iso, utc_iso
from runtime.fsutil import atomic_write

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class SessionEntry:
    """One session. Times are epoch seconds in memory, RFC 3339 strings on disk."""

    session_key: str
    session_id: str
    agent: str
    created_at: float
    updated_at: float
    last_active_at: float | None = None
    last_route: dict[str, Any] | None = None
    counters: dict[str, int] = field(default_factory=dict)
    chat_type: str | None = None
    display_name: str | None = None

    def to_json(self) -> dict[str, Any]:
        last = self.last_active_at
        return {"session_key": self.session_key, "session_id": self.session_id,
                "agent": self.agent, "created_at": utc_iso(self.created_at),
                "updated_at": utc_iso(self.updated_at),
                "last_active_at": utc_iso(last) if last is not None else None,
                "last_route": self.last_route, "counters": dict(self.counters),
                "chat_type": self.chat_type, "display_name": self.display_name}

    @classmethod
    def from_json(cls, key: str, d: dict[str, Any], agent: str, now: float) -> SessionEntry:
        """Tolerant load: missing times are filled (seed 002: old files still load)."""

        def t(name: str, default: float | None) -> float | None:
            v = d.get(name, d.get(to_camel(name)))
            if isinstance(v, (int, float)):
                return float(v) / (1000.0 if v > 1e11 else 1.0)
            if isinstance(v, str):
                try:
                    return parse_iso(v)
                except ValueError:
                    return default
            return default

        updated = t("updated_at", None)
        created = t("created_at", updated if updated is not None else now) or now
        updated = updated if updated is not None else created
        return cls(
            session_key=key,
            session_id=str(d.get("session_id") or d.get("sessionId") or uuid.uuid4()),
            agent=str(d.get("agent") or agent),
            created_at=created,
            updated_at=updated,
            # Missing (an old file): filled from updated_at; an explicit null stays null
            # (a session that only ever had heartbeat/cron turns).
            last_active_at=t("last_active_at", None if any(
                k in d for k in ("last_active_at", "lastActiveAt")) else updated),
            last_route=d.get("last_route") or d.get("lastRoute"),
            counters={k: int(v) for k, v in (d.get("counters") or {}).items()
                      if isinstance(v, (int, float))},
            chat_type=d.get("chat_type"),
            display_name=d.get("display_name"),
        )


def new_session_id() -> str:
    return str(uuid.uuid4())


def reset_due(entry: SessionEntry, *, mode: str, now: float, at_hour: int = 4,
              idle_minutes: int = 60, tz: str = "UTC") -> str | None:
    """Why ``entry`` must roll to a new session before a user turn at ``now``, or None.

    ``daily``: the last user activity is before the most recent ``at_hour:00`` in ``tz``.
    ``idle``: more than ``idle_minutes`` since the last user activity.
    """
    last = entry.last_active_at if entry.last_active_at is not None else entry.updated_at
    if mode == "idle":
        return "idle" if now - last > idle_minutes * 60 else None
    if mode == "daily":
        zone = ZoneInfo(tz)
        local_now = datetime.fromtimestamp(now, zone)
        boundary = local_now.replace(hour=at_hour, minute=0, second=0, microsecond=0)
        if boundary > local_now:
            boundary -= timedelta(days=1)
        # Re-localise after the day arithmetic so DST days get the right offset.
        boundary = boundary.replace(tzinfo=None).replace(tzinfo=zone)
        return "daily" if last < boundary.timestamp() else None
    return None


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(path.suffix + ".lock"), "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


class SessionStore:
    """Sessions of one agent. Not thread-safe: use from the event loop only.

    Persistence: each entry's JSON is cached and re-encoded only when it changes; one
    writer task renders the file from the cache and writes it off the event loop. Routine
    changes wait up to ``flush_interval`` seconds to share a write; ``flush()`` (and so
    ``create``) asks for the next write and returns once it is on disk, so concurrent
    creations share one write (group commit).
    """

    def __init__(self, path: Path, agent: str, *, clock: Clock = SYSTEM_CLOCK,
                 flush_interval: float = 0.25) -> None:
        self.path = path
        self.agent = agent
        self.clock = clock
        self.flush_interval = flush_interval
        self._entries: dict[str, SessionEntry] = {}
        self._encoded: dict[str, str] = {}
        self._changed: set[str] = set()
        self._dirty = False
        self._waiters: list[asyncio.Future] = []
        self._urgent: asyncio.Event | None = None
        self._writer: asyncio.Task | None = None

    # -- loading -------------------------------------------------------------------------
    def load(self) -> SessionStore:
        """Read sessions.json (missing file = empty store). Raises ValueError naming the file
        when it is not valid JSON (it is never overwritten in that case)."""
        self._entries = read_sessions_file(self.path, self.agent, self.clock.time())
        self._encoded.clear()
        self._changed = set(self._entries)
        return self

    # -- queries -------------------------------------------------------------------------
    def get(self, key: str) -> SessionEntry | None:
        return self._entries.get(key)

    def by_session_id(self, session_id: str) -> SessionEntry | None:
        return next((e for e in self._entries.values() if e.session_id == session_id), None)

    def entries(self) -> list[SessionEntry]:
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    # -- updates -------------------------------------------------------------------------
    async def create(self, key: str, *, chat_type: str | None = None,
                     route: dict[str, Any] | None = None,
                     display_name: str | None = None) -> SessionEntry:
        """Start a fresh session for ``key`` (replacing any current one).

        The write is started at once (not after the coalescing delay) but not awaited: a
        turn's first model call should not wait for an fsync. Call ``flush()`` when the
        entry must be on disk before going on."""
        now = self.clock.time()
        entry = SessionEntry(session_key=key, session_id=new_session_id(), agent=self.agent,
                             created_at=now, updated_at=now, last_active_at=None,
                             last_route=route, chat_type=chat_type, display_name=display_name)
        self._entries[key] = entry
        self.mark_dirty(key, urgent=True)
        return entry

    def touch(self, key: str, *, activity: bool, route: dict[str, Any] | None = None,
              counters: dict[str, int] | None = None,
              updated: bool | None = None) -> SessionEntry | None:
        """Record a turn: ``activity`` (a user message) refreshes updated_at and
        last_active_at and may set last_route; ``updated`` (default: ``activity``) refreshes
        updated_at alone (a delivered heartbeat or cron turn). Counters are added.
        Persisted by the coalescing writer."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        now = self.clock.time()
        if activity or updated:
            entry.updated_at = now
        if activity:
            entry.last_active_at = now
            if route:
                entry.last_route = route
        for name, delta in (counters or {}).items():
            entry.counters[name] = entry.counters.get(name, 0) + delta
        self.mark_dirty(key)
        return entry

    def set_updated_at(self, key: str, value: float) -> None:
        """Restore ``updated_at`` (a HEARTBEAT_OK beat must leave no trace)."""
        entry = self._entries.get(key)
        if entry is not None and entry.updated_at != value:
            entry.updated_at = value
            self.mark_dirty(key)

    def remove(self, key: str) -> SessionEntry | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._encoded.pop(key, None)
            self.mark_dirty(None)
        return entry

    def mark_dirty(self, key: str | None = None, *, urgent: bool = False) -> None:
        """Note a change (of ``key``'s entry) for the next write; ``urgent`` skips the
        coalescing delay."""
        if key is not None:
            self._changed.add(key)
        self._dirty = True
        try:
            self._ensure_writer()
        except RuntimeError:  # no running loop (offline CLI use): write now
            self._write(self._render())
            return
        if urgent:
            assert self._urgent is not None
            self._urgent.set()

    # -- writing -------------------------------------------------------------------------
    async def flush(self) -> None:
        """Return once every change made so far is on disk. Raises OSError if the write
        failed (the changes stay pending and are retried by the next write)."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._dirty = True
        self._ensure_writer()
        assert self._urgent is not None
        self._urgent.set()
        await fut

    def _ensure_writer(self) -> None:
        if self._writer is None or self._writer.done():
            loop = asyncio.get_running_loop()
            self._urgent = self._urgent or asyncio.Event()
            self._writer = loop.create_task(self._write_loop())

    async def _write_loop(self) -> None:
        assert self._urgent is not None
        while self._dirty:
            if not self._waiters:
                try:  # routine changes: wait a little to share one write
                    await asyncio.wait_for(self._urgent.wait(), self.flush_interval)
                except TimeoutError:
                    pass
            self._urgent.clear()
            waiters, self._waiters = self._waiters, []
            self._dirty = False
            payload = self._render()
            try:
                await asyncio.to_thread(self._write, payload)
            except OSError as exc:
                self._dirty = True
                log.error("sessions_write_failed", path=str(self.path), error=str(exc))
                for w in waiters:
                    if not w.done():
                        w.set_exception(exc)
                await asyncio.sleep(self.flush_interval)
                continue
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    def _render(self) -> bytes:
        """The file's bytes, re-encoding only entries that changed since the last render."""
        for key in self._changed:
            entry = self._entries.get(key)
            if entry is not None:
                self._encoded[key] = json.dumps(entry.to_json(), ensure_ascii=False,
                                                separators=(",", ":"))
        self._changed.clear()
        body = ",\n".join(f"{json.dumps(k, ensure_ascii=False)}:{v}"
                           for k, v in self._encoded.items())
        return f'{{"version":1,"sessions":{{\n{body}\n}}}}\n'.encode()

    def _write(self, payload: bytes) -> None:
        with _file_lock(self.path):
            atomic_write(self.path, payload)

    async def close(self) -> None:
        """Write pending changes and wait for the writer (an in-flight write is never
        cancelled: it would still finish in its thread, possibly after a newer one)."""
        if self._dirty:
            await self.flush()
        if self._writer is not None and not self._writer.done():
            await self._writer


def read_sessions_file(path: Path, agent: str, now: float) -> dict[str, SessionEntry]:
    """Parse a sessions.json (OpenClaw's flat ``{key: entry}`` form is accepted too)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); "
                         f"fix or move the file aside") from None
    sessions = data.get("sessions", data) if isinstance(data, dict) else {}
    out: dict[str, SessionEntry] = {}
    for key, entry in sessions.items():
        if isinstance(entry, dict) and key != "version":
            out[key] = SessionEntry.from_json(key, entry, agent, now)
    return out
