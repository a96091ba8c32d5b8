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
import os
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Iterator
from zoneinfo import ZoneInfo

import structlog
from pydantic.alias_generators import to_camel

from runtime.clock import SYSTEM_CLOCK, Clock, parse_iso, utc_iso

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
        d = asdict(self)
        for k in ("created_at", "updated_at", "last_active_at"):
            d[k] = utc_iso(d[k]) if d[k] is not None else None
        return d

    @classmethod
    def from_json(cls, key: str, d: dict[str, Any], agent: str, now: float) -> "SessionEntry":
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
            last_active_at=t("last_active_at", updated),
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


def atomic_write_json(path: Path, data: Any) -> None:
    """Write JSON via temp file + fsync + rename (+ directory fsync): never torn."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = json.dumps(data, ensure_ascii=False, indent=1).encode("utf-8")
    with open(tmp, "wb") as fh:
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class SessionStore:
    """Sessions of one agent. Not thread-safe: use from the event loop only."""

    def __init__(self, path: Path, agent: str, *, clock: Clock = SYSTEM_CLOCK,
                 flush_interval: float = 0.25) -> None:
        self.path = path
        self.agent = agent
        self.clock = clock
        self.flush_interval = flush_interval
        self._entries: dict[str, SessionEntry] = {}
        self._dirty = False
        self._flush_task: asyncio.Task | None = None
        self._write_lock = asyncio.Lock()

    # -- loading -------------------------------------------------------------------------
    def load(self) -> "SessionStore":
        """Read sessions.json (missing file = empty store). Raises ValueError naming the file
        when it is not valid JSON (it is never overwritten in that case)."""
        self._entries = read_sessions_file(self.path, self.agent, self.clock.time())
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
        """Start a fresh session for ``key`` (replacing any current one) and persist it
        before returning."""
        now = self.clock.time()
        entry = SessionEntry(session_key=key, session_id=new_session_id(), agent=self.agent,
                             created_at=now, updated_at=now, last_active_at=None,
                             last_route=route, chat_type=chat_type, display_name=display_name)
        self._entries[key] = entry
        await self.flush()
        return entry

    def touch(self, key: str, *, activity: bool, route: dict[str, Any] | None = None,
              counters: dict[str, int] | None = None,
              updated: bool | None = None) -> SessionEntry | None:
        """Record a turn: ``activity`` (a user message) refreshes updated_at and
        last_active_at and may set last_route; ``updated`` (default: ``activity``) refreshes
        updated_at alone (a delivered heartbeat or cron turn). Counters are added.
        Persisted by the coalescing flusher."""
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
        self.mark_dirty()
        return entry

    def set_updated_at(self, key: str, value: float) -> None:
        """Restore ``updated_at`` (a HEARTBEAT_OK beat must leave no trace)."""
        entry = self._entries.get(key)
        if entry is not None and entry.updated_at != value:
            entry.updated_at = value
            self.mark_dirty()

    def remove(self, key: str) -> SessionEntry | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.mark_dirty()
        return entry

    def mark_dirty(self) -> None:
        self._dirty = True
        if self._flush_task is None or self._flush_task.done():
            try:
                self._flush_task = asyncio.get_running_loop().create_task(self._delayed_flush())
            except RuntimeError:  # no loop (CLI offline use): write now
                self._write_now()

    async def _delayed_flush(self) -> None:
        await asyncio.sleep(self.flush_interval)  # real time: only batches disk writes
        await self.flush()

    async def flush(self) -> None:
        """Write the store now if anything changed (off the event loop)."""
        async with self._write_lock:
            self._dirty = False
            snapshot = self._snapshot()
            try:
                await asyncio.to_thread(self._write_snapshot, snapshot)
            except OSError as exc:
                self._dirty = True
                log.error("sessions_write_failed", path=str(self.path), error=str(exc))
                raise

    def _snapshot(self) -> dict[str, Any]:
        return {"version": 1,
                "sessions": {k: e.to_json() for k, e in self._entries.items()}}

    def _write_snapshot(self, snapshot: dict[str, Any]) -> None:
        with _file_lock(self.path):
            atomic_write_json(self.path, snapshot)

    def _write_now(self) -> None:
        self._dirty = False
        self._write_snapshot(self._snapshot())

    async def close(self) -> None:
        """Write pending changes. Waits for an in-flight write instead of cancelling it: a
        cancelled write would still finish in its thread, possibly after a newer one."""
        if self._flush_task is not None and not self._flush_task.done():
            await self._flush_task
        if self._dirty:
            await self.flush()


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
