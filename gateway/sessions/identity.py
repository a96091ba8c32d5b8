"""One current session id per session key, cluster-wide (README "Replicas").

On one host the session store is the only writer of its sessions. Replicas share
PostgreSQL's ``sessions`` table (one row per agent and session key), and each keeps a copy
in memory: a replica that did not run a session lately may hold an old entry of it, or
none. So:

- a new session id is written compare-and-set (:func:`claim_id`): it replaces the id the
  creating replica knew (or none) only if that is still the stored one; when another
  replica made a different id current meanwhile, that one is taken instead
  (:class:`SessionExists`) and nothing forks — one session id, one transcript, one
  timeline per key;
- reads for the CLI and the control API (``sessions list``/``show``, ``system event``,
  ``sessions reset``) answer from the shared table (:func:`lookup`, :func:`entries`,
  :func:`find`), whichever replica runs the session; writes go through the session's
  lane (gateway/cluster/lanes.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from gateway.sessions.entry import SessionEntry
from runtime.storage.sessions import SessionStoreError

log = structlog.get_logger(__name__)

FIX = "check that PostgreSQL is up (`tidegate storage status`), then send the message again"


class SessionExists(Exception):
    """``create`` found another current session id for the key (written by another
    replica meanwhile); ``entry`` is that session, now the one held here too."""

    def __init__(self, entry: SessionEntry) -> None:
        super().__init__(f"{entry.session_key} already has session {entry.session_id}")
        self.entry = entry


async def claim_id(store: Any, key: str, entry: SessionEntry,
                   old: SessionEntry | None) -> bool:
    """For ``store.create`` (gateway/sessions/store.py) on a shared backend: write the
    new ``entry`` compare-and-set (it replaces ``old``'s id, or none). True when written.
    Raises SessionExists when another id is current for ``key`` (taken into ``store``),
    SessionStoreError when PostgreSQL cannot be written. False: not a shared backend, or
    the write was fenced (the lane moved; the store's usual fenced write reports it)."""
    claim = getattr(store.backend, "claim_id", None)
    if claim is None:
        return False
    fence = store.fence(key) if store.fence is not None else None
    replaces = old.session_id if old is not None else None
    try:
        written, stored = await asyncio.to_thread(claim, key, entry.to_json(), replaces,
                                                  fence)
    except OSError as exc:
        log.error("sessions_write_failed", path=str(store.backend.path), error=str(exc))
        raise SessionStoreError(f"the session of {key} cannot be created now ({exc})",
                                path=str(store.backend.path), fix=FIX) from None
    if written:
        store._put(key, entry)
        store._changed.discard(key)
        return True
    if stored is None or stored.get("session_id") == replaces:
        return False
    current = SessionEntry.from_json(key, stored, store.agent, store.clock.time())
    log.warning("session_id_taken_elsewhere", agent=store.agent, session_key=key,
                session_id=current.session_id, discarded=entry.session_id,
                replaced=replaces)
    store._put(key, current)
    raise SessionExists(current)


def stored(store: Any, key: str) -> SessionEntry | None:
    """The current entry of ``key`` as the shared store has it, or ``store``'s own when
    it has unwritten changes of it; one host: ``store.get``. A failed read (an outage)
    answers from memory. Blocking (a PostgreSQL read): call off the event loop."""
    load = getattr(store.backend, "load_one", None)
    if load is None or key in store._changed:
        return store.get(key)
    try:
        raw = load(key)
    except OSError:
        return store.get(key)
    if raw is None:
        return store.get(key)  # e.g. created here, its write in flight
    return SessionEntry.from_json(key, raw, store.agent, store.clock.time())


async def lookup(store: Any, key: str) -> SessionEntry | None:
    """:func:`stored` off the event loop (one host: ``store.get``, no thread)."""
    if not store.shared:
        return store.get(key)
    return await asyncio.to_thread(stored, store, key)


async def entries(store: Any) -> list[SessionEntry]:
    """Every session of ``store``'s agent as the shared store has them (see
    :func:`lookup`) with this replica's unwritten changes; one host: ``entries()``."""
    if not store.shared:
        return store.entries()
    try:
        rows = await asyncio.to_thread(store.backend.load_all)
    except (OSError, SessionStoreError):
        return store.entries()
    now = store.clock.time()
    out = {k: SessionEntry.from_json(k, d, store.agent, now) for k, d in rows.items()}
    for entry in store.entries():
        if entry.session_key in store._changed or entry.session_key not in out:
            out[entry.session_key] = entry
    return list(out.values())


async def find(agents: dict[str, Any], key: str) -> tuple[Any, SessionEntry] | None:
    """``(agent, entry)`` of the agent that has a current session under ``key`` (read as
    :func:`lookup` does), or None."""
    for agent in agents.values():
        entry = await lookup(agent.store, key)
        if entry is not None:
            return agent, entry
    return None
