"""The session store: session key -> entry, one SQLite store per agent.

File: ``<state_dir>/agents/<agent>/sessions/sessions.db`` (one row per session, see
``runtime.storage.embedded.sessions_sqlite``); an older ``sessions.json`` next to it
(``{"version": 1, "sessions": {<session_key>: entry}}``, or OpenClaw's flat
``{key: entry}``) is migrated at the first start and renamed ``sessions.json.migrated``.
``tidegate sessions export --format openclaw`` writes OpenClaw's ``sessions.json``. Each
entry has ``session_id``, ``agent``, ``created_at``, ``updated_at``, ``last_active_at``
(RFC 3339 UTC), ``last_route`` (channel, account, to, thread) and ``counters``. The daemon
keeps the authoritative copy in memory and coalesces routine updates (at most one
transaction per ``flush_interval``, 5 s: a kill -9 can cost the last seconds of counters
and times, never a session), while creating or resetting a session is written at once.
Reset policy (issue 2 §5): ``none`` | ``daily`` (``at_hour`` in the user's
timezone) | ``idle`` (``idle_minutes``); only user activity counts (heartbeat and cron
turns never roll or refresh a session).

Replicas (issue 15): ``fence(key)`` gives the lane lease a change of ``key`` is made under
(gateway/cluster/fencing.py); on PostgreSQL the row is written only while that lease is
current (``write_fenced``), a refused row is logged (``session_write_fenced``) and handed
to ``on_fenced``; ``reload(key)`` takes the row another replica left when this one takes
the session's lane.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import structlog

from gateway.sessions import identity
from gateway.sessions.entry import SessionEntry, new_session_id, read_sessions_file
from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.state_files import report_corrupt
from runtime.storage.embedded.sessions_sqlite import FIX, SqliteSessionRecords
from runtime.storage.sessions import SessionRecords, SessionStoreError

log = structlog.get_logger(__name__)


def _legacy_json(db_path: Path) -> Path:
    return db_path.with_name("sessions.json")


class SessionStore:
    """Sessions of one agent. Not thread-safe: use from the event loop only.

    Persistence (issue 9): one SQLite row per session
    (``runtime.storage.embedded.sessions_sqlite``); a write carries only the sessions that
    changed, so its cost does not depend on how many exist. One writer task writes off the
    event loop; routine changes wait up to ``flush_interval`` seconds to share a
    transaction; ``flush()`` (and so ``create``) asks for the next write and returns once it
    is committed, so concurrent creations share one transaction (group commit).

    A store that cannot be opened (``problem`` is set) holds nothing and refuses
    ``create`` with SessionStoreError: only its agent is out of service.
    """

    def __init__(self, path: Path, agent: str, *, clock: Clock = SYSTEM_CLOCK,
                 flush_interval: float = 5.0, records: SessionRecords | None = None) -> None:
        self.path = path
        self.agent = agent
        self._records = records  # another backend (PostgreSQL); default: sessions.db
        self.clock = clock
        self.flush_interval = flush_interval
        self.problem: str | None = None
        self.backend: SessionRecords | None = None
        self._entries: dict[str, SessionEntry] = {}
        self._by_id: dict[str, str] = {}
        self._changed: set[str] = set()
        self._removed: set[str] = set()
        self._dirty = False
        self._waiters: list[asyncio.Future] = []
        self._urgent: asyncio.Event | None = None
        self._writer: asyncio.Task | None = None
        self.fence: Any = None  # session key -> lane fence, or None (replicas)
        self.on_fenced: Any = None  # list of session keys whose rows were refused
        self._fences: dict[str, Any] = {}  # changed key -> the fence it was changed under

    # -- loading -------------------------------------------------------------------------
    def load(self) -> SessionStore:
        """Open the store, first migrating a ``sessions.json`` next to it (then renamed
        ``sessions.json.migrated``). Raises SessionStoreError naming the file and the fix
        when the database or the old file is unreadable (neither is overwritten)."""
        legacy = _legacy_json(self.path)
        migrate: dict[str, SessionEntry] | None = None
        if self._records is None and not self.path.exists() and legacy.exists():
            try:
                migrate = read_sessions_file(legacy, self.agent, self.clock.time())
            except ValueError as exc:
                raise SessionStoreError(str(exc), path=str(legacy), fix=(
                    "repair the JSON or move the file aside (a new, empty store is "
                    "created; transcripts are kept)")) from None
        backend = self._records or SqliteSessionRecords(self.path)
        if migrate is not None:
            backend.write({k: e.to_json() for k, e in migrate.items()}, [])
            legacy.rename(legacy.with_name("sessions.json.migrated"))
            log.info("sessions_migrated", agent=self.agent, sessions=len(migrate),
                     source=str(legacy), path=str(self.path))
        now = self.clock.time()
        self._entries = {k: SessionEntry.from_json(k, d, self.agent, now)
                         for k, d in backend.load_all().items()}
        self._by_id = {e.session_id: k for k, e in self._entries.items()}
        self.backend = backend
        return self

    # -- queries -------------------------------------------------------------------------
    def get(self, key: str) -> SessionEntry | None:
        return self._entries.get(key)

    def by_session_id(self, session_id: str) -> SessionEntry | None:
        key = self._by_id.get(session_id)
        return self._entries.get(key) if key is not None else None

    def entries(self) -> list[SessionEntry]:
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def shared(self) -> bool:
        """The backend is shared with other replicas (PostgreSQL)."""
        return hasattr(self.backend, "load_one")

    # -- updates -------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self.problem is not None:
            raise SessionStoreError(f"agent {self.agent!r} is out of service: {self.problem}",
                                    path=str(self.path), fix=FIX)

    async def create(self, key: str, *, chat_type: str | None = None,
                     route: dict[str, Any] | None = None,
                     display_name: str | None = None) -> SessionEntry:
        """Start a fresh session for ``key`` (replacing any current one).

        The write is started at once (not after the coalescing delay) but not awaited: a
        turn's first model call should not wait for it. Call ``flush()`` when the entry
        must be on disk before going on. Raises SessionStoreError when the store is out of
        service.

        On a shared backend (PostgreSQL, replicas) the new id is written compare-and-set
        before it is returned: it replaces the id this store holds for ``key`` (or none)
        only if that is still the stored one; otherwise SessionExists carries the session
        that is current instead (one session id per key, cluster-wide)."""
        self._check_usable()
        now = self.clock.time()
        entry = SessionEntry(session_key=key, session_id=new_session_id(), agent=self.agent,
                             created_at=now, updated_at=now, last_active_at=None,
                             last_route=route, chat_type=chat_type, display_name=display_name)
        old = self._entries.get(key)
        if await identity.claim_id(self, key, entry, old):
            return entry
        self._put(key, entry)
        self.mark_dirty(key, urgent=True)
        return entry

    def _put(self, key: str, entry: SessionEntry) -> None:
        """Make ``entry`` the current one of ``key`` here (no write)."""
        old = self._entries.get(key)
        if old is not None:
            self._by_id.pop(old.session_id, None)
        self._entries[key] = entry
        self._by_id[entry.session_id] = key

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

    def set_model(self, key: str, ref: str | None) -> None:
        """Set (or clear, ``None``) the session's model override; persisted."""
        self._set_choice(key, "model_override", ref)

    def set_verbose(self, key: str, on: bool) -> None:
        """``/verbose on|off`` for the session; persisted."""
        self._set_choice(key, "verbose", on)

    def set_think(self, key: str, level: str | None) -> None:
        """``/think`` level for the session (None: off); persisted."""
        self._set_choice(key, "think", level)

    def _set_choice(self, key: str, name: str, value: Any) -> None:
        entry = self._entries.get(key)
        if entry is not None and getattr(entry, name) != value:
            setattr(entry, name, value)
            self.mark_dirty(key, urgent=True)



    def set_updated_at(self, key: str, value: float) -> None:
        """Restore ``updated_at`` (a HEARTBEAT_OK beat must leave no trace)."""
        entry = self._entries.get(key)
        if entry is not None and entry.updated_at != value:
            entry.updated_at = value
            self.mark_dirty(key)

    def remove(self, key: str) -> SessionEntry | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._by_id.pop(entry.session_id, None)
            self._changed.discard(key)
            self._removed.add(key)
            self.mark_dirty(None)
        return entry

    def mark_dirty(self, key: str | None = None, *, urgent: bool = False) -> None:
        """Note a change (of ``key``'s entry) for the next write; ``urgent`` skips the
        coalescing delay."""
        if self.backend is None:
            return  # out of service (or never loaded): nothing to persist to
        if key is not None:
            self._changed.add(key)
            self._removed.discard(key)
            if self.fence is not None and (fence := self.fence(key)) is not None:
                self._fences[key] = fence
        self._dirty = True
        try:
            self._ensure_writer()
        except RuntimeError:  # no running loop (offline CLI use): write now
            self._write(*self._take_changes())
            return
        if urgent:
            assert self._urgent is not None
            self._urgent.set()

    # -- writing -------------------------------------------------------------------------
    async def flush(self) -> None:
        """Return once every change made so far is committed. Raises OSError if the write
        failed (the changes stay pending and are retried by the next write)."""
        if self.backend is None:
            return
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

    def _take_changes(self) -> tuple[dict[str, dict[str, Any]], list[str]]:
        upserts = {k: e.to_json() for k in self._changed
                   if (e := self._entries.get(k)) is not None}
        deletes = sorted(self._removed)
        self._changed.clear()
        self._removed.clear()
        return upserts, deletes

    async def _write_loop(self) -> None:
        assert self._urgent is not None
        while self._dirty:
            if not self._waiters:
                try:  # routine changes: wait a little to share one transaction
                    await asyncio.wait_for(self._urgent.wait(), self.flush_interval)
                except TimeoutError:
                    pass
            self._urgent.clear()
            waiters, self._waiters = self._waiters, []
            self._dirty = False
            upserts, deletes = self._take_changes()
            fences = {k: f for k in upserts if (f := self._fences.pop(k, None))}
            try:
                if upserts or deletes:
                    refused = await asyncio.to_thread(self._write, upserts, deletes, fences)
                    if refused:
                        self._refused(refused, fences)
            except OSError as exc:
                self._dirty = True
                self._changed.update(k for k in upserts if k in self._entries)
                self._fences.update({k: f for k, f in fences.items() if k not in self._fences})
                self._removed.update(k for k in deletes if k not in self._entries)
                log.error("sessions_write_failed", path=str(getattr(self.backend, "path",
                                                                    self.path)),
                          error=str(exc))
                for w in waiters:
                    if not w.done():
                        w.set_exception(exc)
                await asyncio.sleep(self.flush_interval)
                continue
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    def _write(self, upserts: dict[str, dict[str, Any]], deletes: list[str],
               fences: dict[str, Any] | None = None) -> list[str]:
        """The write; the keys a fenced backend refused."""
        assert self.backend is not None
        if fences and hasattr(self.backend, "write_fenced"):
            return self.backend.write_fenced(upserts, deletes, fences)
        self.backend.write(upserts, deletes)
        return []

    def _refused(self, keys: list[str], fences: dict[str, Any]) -> None:
        for key in keys:
            log.warning("session_write_fenced", agent=self.agent, session_key=key,
                        lease=fences[key][0], replica=fences[key][1],
                        generation=fences[key][2],
                        reason="another replica took this session's lane over; its row "
                               "stands, this change is dropped")
        if self.on_fenced is not None:
            self.on_fenced(keys)

    async def reload(self, key: str) -> None:
        """Take ``key``'s entry from the backend (another replica ran the session last);
        a change not yet written here is dropped. No-op for a backend without
        ``load_one`` (one host)."""
        load = getattr(self.backend, "load_one", None)
        if load is None:
            return
        raw = await asyncio.to_thread(load, key)
        if raw is None:
            return  # nothing stored: what is here stands
        self._changed.discard(key)
        self._fences.pop(key, None)
        old = self._entries.get(key)
        if old is not None:
            self._by_id.pop(old.session_id, None)
        entry = SessionEntry.from_json(key, raw, self.agent, self.clock.time())
        self._entries[key] = entry
        self._by_id[entry.session_id] = key

    async def close(self) -> None:
        """Write pending changes and wait for the writer (an in-flight write is never
        cancelled: it would still finish in its thread, possibly after a newer one)."""
        if self._dirty:
            await self.flush()
        if self._writer is not None and not self._writer.done():
            await self._writer
        if self.backend is not None:
            self.backend.close()


def open_session_store(path: Path, agent: str, *, clock: Clock = SYSTEM_CLOCK,
                       records: SessionRecords | None = None) -> SessionStore:
    """The agent's session store, loaded. When it cannot be opened, reports it the way
    every corrupt state file is reported (``runtime.state_files.report_corrupt``: one
    ERROR ``state_file_corrupt`` with owner, path, error, effect and fix) and returns a
    store in ``problem`` state (the problem line): that agent is out of service, the rest
    of the gateway runs."""
    store = SessionStore(path, agent, clock=clock, records=records)
    try:
        return store.load()
    except SessionStoreError as exc:
        store.problem = report_corrupt(
            f"session store of agent {agent}", exc.path, exc.reason, fix=exc.fix,
            effect=f"agent {agent!r} is out of service (its messages get a notice; other "
                   "agents run)")
        return store


def session_db_path(state_dir: Path, agent: str) -> Path:
    """``<state_dir>/agents/<agent>/sessions/sessions.db``."""
    return state_dir / "agents" / agent / "sessions" / "sessions.db"


def read_sessions(state_dir: Path, agent: str, now: float,
                  records: SessionRecords | None = None) -> dict[str, SessionEntry]:
    """Read an agent's sessions without the daemon (the CLI): ``records`` (PostgreSQL), or
    the SQLite store read-only, else a not yet migrated ``sessions.json``. Raises
    SessionStoreError when unreadable."""
    path = session_db_path(state_dir, agent)
    try:
        backend = records or SqliteSessionRecords(path, readonly=True)
    except FileNotFoundError:
        return read_sessions_file(_legacy_json(path), agent, now)
    try:
        return {k: SessionEntry.from_json(k, d, agent, now)
                for k, d in backend.load_all().items()}
    finally:
        backend.close()
