"""Per-profile failover state (issue 10): cooldowns, error counts per class, last_good,
last_used — kept in memory and in ``<state_dir>/auth-state.json`` (atomic replace), so a
restart neither forgets a profile that is out of quota nor keeps one benched forever.

File shape::

    {"version": 1, "providers": {"<provider>": {"last_good": "<profile id>" | null,
      "profiles": {"<profile id>": {"cooldown_until": <epoch s> | null,
        "cooldown_class": "<error class>" | null, "errors": {"<class>": n},
        "failures": <consecutive failures>, "last_error_class": ..., "last_error_at": ...,
        "last_used": <epoch s>, "last_ok": <epoch s>}}}}}

A profile whose cooldown has passed is tried again (half-open): one more failure benches
it again, a success clears it. A corrupt file disables only auth-state persistence: a
structured ERROR names the file, the state lives on in memory and the file is left as it
is for the operator (handbook "Bad input"; issue 8 item 11). Once the operator removes or
repairs the file, the next save (or status check) notices, logs ``auth_state_resumed`` and
writes the state kept in memory: persistence resumes without a restart.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from runtime.storage.documents import DocumentRecords
from runtime.storage.embedded.document_file import DocumentFile

log = structlog.get_logger(__name__)

VERSION = 1


@dataclass
class ProfileState:
    """One profile's record (times are epoch seconds)."""

    cooldown_until: float | None = None
    cooldown_class: str | None = None
    errors: dict[str, int] = field(default_factory=dict)
    failures: int = 0
    last_error_class: str | None = None
    last_error_at: float | None = None
    last_used: float | None = None
    last_ok: float | None = None

    def cooling(self, now: float) -> float:
        """Seconds of cooldown left (0 when usable)."""
        return max(0.0, (self.cooldown_until or 0.0) - now)


class AuthState:
    """All providers' profile states. ``path`` None keeps everything in memory."""

    def __init__(self, path: Path | None, records: DocumentRecords | None = None) -> None:
        self.store: DocumentRecords | None = records if records is not None else (
            DocumentFile(path, durable=False) if path is not None else None)
        self.path = self.store.path if self.store is not None else None
        self.persist = self.store is not None
        self.problem: str | None = None
        self._providers: dict[str, dict[str, Any]] = {}
        self._adopted = 0  # the shared store's merge count this view was taken from

    def _read(self) -> dict[str, Any] | None:
        """The stored document (None: none yet). Raises OSError/ValueError."""
        assert self.store is not None
        raw = self.store.read()
        return None if raw is None else _parse(raw)

    def load(self) -> AuthState:
        """Read the stored state if there is one. A corrupt one disables persistence
        (logged)."""
        if self.store is None:
            return self
        try:
            self._fill(self._read())
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            self._providers.clear()
            self.persist = False
            self.problem = (f"auth state file {self.path} is corrupt ({exc}); profile "
                            f"cooldowns are kept in memory only until it is fixed or removed")
            log.error("auth_state_corrupt", path=str(self.path), error=str(exc)[:300])
        return self

    def _fill(self, data: dict[str, Any] | None) -> None:
        """Replace the in-memory state by document ``data`` (the file's shape)."""
        self._providers = {}
        for name, raw in (data or {"providers": {}})["providers"].items():
            entry = self._entry(name)
            entry["last_good"] = raw.get("last_good")
            for pid, ps in (raw.get("profiles") or {}).items():
                entry["profiles"][pid] = ProfileState(**ps)

    def _entry(self, provider: str) -> dict[str, Any]:
        return self._providers.setdefault(provider, {"last_good": None, "profiles": {}})

    def _adopt(self) -> None:
        """A store shared by replicas (PostgreSQL) merges every change into the stored
        document: once this replica's changes are in, its view becomes that document, so
        it also sees the cooldowns other replicas set."""
        merged = getattr(self.store, "merged", None)
        got = merged() if merged is not None and self.persist else None
        if got is not None and got[0] != self._adopted:
            self._adopted = got[0]
            try:
                self._fill(_parse(got[1]))
            except (ValueError, TypeError, AttributeError) as exc:
                log.error("auth_state_corrupt", path=str(self.path), error=str(exc)[:300])

    def profile(self, provider: str, profile: str) -> ProfileState:
        self._adopt()
        return self._entry(provider)["profiles"].setdefault(profile, ProfileState())

    def last_good(self, provider: str) -> str | None:
        self._adopt()
        return self._entry(provider)["last_good"]

    def success(self, provider: str, profile: str, now: float) -> None:
        """A call on ``profile`` succeeded: clear its cooldown, make it last_good."""
        ps = self.profile(provider, profile)
        changed = bool(ps.failures or ps.cooldown_until) or self.last_good(provider) != profile
        self._apply(("success", provider, profile, now))
        if changed:
            self.save(("success", provider, profile, now))

    def failure(self, provider: str, profile: str, error_class: str, now: float,
                cooldown: float) -> None:
        """A failed attempt of ``error_class``; ``cooldown`` seconds benches the profile
        (0: it stays usable)."""
        op = ("failure", provider, profile, error_class, now, cooldown)
        self._apply(op)
        self.save(op)

    def reset(self, provider: str, profile: str, now: float) -> None:
        """Clear the profile's cooldown and failure count (its error history stays)."""
        op = ("reset", provider, profile, now)
        self._apply(op)
        self.save(op)

    def _apply(self, op: tuple) -> None:
        """One change, as a merge: counts add up, a cooldown only ever extends, a
        success clears only failures recorded before it. Applied to memory, and on a
        shared store to the stored document under its row lock (:meth:`save`)."""
        kind, provider, profile, *rest = op
        entry = self._entry(provider)
        ps = entry["profiles"].setdefault(profile, ProfileState())
        if kind == "reset":  # the operator put it back in service (credits topped up...)
            ps.failures, ps.cooldown_until, ps.cooldown_class = 0, None, None
            ps.last_error_at = max(ps.last_error_at or 0.0, rest[0])
            return
        if kind == "success":
            (now,) = rest
            if ps.last_error_at is None or ps.last_error_at <= now:
                ps.failures, ps.cooldown_until, ps.cooldown_class = 0, None, None
                entry["last_good"] = profile
            ps.last_ok, ps.last_used = max(ps.last_ok or now, now), max(ps.last_used or now, now)
            return
        error_class, now, cooldown = rest
        ps.errors[error_class] = ps.errors.get(error_class, 0) + 1
        ps.failures += 1
        if ps.last_error_at is None or now >= ps.last_error_at:
            ps.last_error_class, ps.last_error_at = error_class, now
        ps.last_used = max(ps.last_used or now, now)
        if cooldown > 0:
            ps.cooldown_until = max(ps.cooldown_until or 0.0, now + cooldown)
            ps.cooldown_class = error_class
            if entry["last_good"] == profile:
                entry["last_good"] = None

    def _merger(self, op: tuple) -> Any:
        """``change(stored bytes) -> bytes``: ``op`` applied to the stored document (run
        by the store under its row lock; never raises)."""
        def change(old: bytes | None) -> bytes:
            merged = AuthState(None)
            try:
                merged._fill(_parse(old) if old else None)
            except (ValueError, TypeError, AttributeError) as exc:
                log.error("auth_state_corrupt", path=str(self.path), error=str(exc)[:300],
                          action="replaced by the merged change")
                merged = AuthState(None)
            merged._apply(op)
            return _encode(merged.snapshot())
        return change

    def snapshot(self) -> dict[str, Any]:
        """The file's JSON shape."""
        return {"version": VERSION, "providers": {
            name: {"last_good": e["last_good"],
                   "profiles": {pid: asdict(ps) for pid, ps in e["profiles"].items()}}
            for name, e in self._providers.items()}}

    def recheck(self) -> bool:
        """After a corrupt file disabled persistence: resume it when the file is gone or
        parses again (the in-memory state, the newer one, then replaces it). Returns
        whether persistence is on."""
        if self.persist or self.store is None or self.problem is None:
            return self.persist
        try:
            self._read()
        except (OSError, ValueError):
            return False
        self.persist, self.problem = True, None
        log.info("auth_state_resumed", path=str(self.path),
                 reason="the corrupt file was removed or repaired")
        self.save()
        return True

    def save(self, op: tuple | None = None) -> None:
        """Store the state: the whole document, or on a store shared by replicas the
        change ``op`` merged into the stored one (two replicas' failures both count)."""
        if not self.recheck() or self.store is None:
            return
        if op is not None and getattr(self.store, "shared", False):
            self.store.update(self._merger(op))  # type: ignore[attr-defined]
            return
        data = _encode(self.snapshot())
        try:
            self.store.write(data)
        except OSError as exc:
            log.error("auth_state_write_failed", path=str(self.path), error=str(exc))


def _parse(raw: bytes) -> dict[str, Any]:
    """The document in ``raw``. Raises ValueError when it is not one."""
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("providers"), dict):
        raise ValueError("expected {\"version\": 1, \"providers\": {...}}")
    return data


def _encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, indent=1, sort_keys=True).encode()
