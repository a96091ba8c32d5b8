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

    def _read(self) -> dict[str, Any] | None:
        """The stored document (None: none yet). Raises OSError/ValueError."""
        assert self.store is not None
        raw = self.store.read()
        if raw is None:
            return None
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("providers"), dict):
            raise ValueError("expected {\"version\": 1, \"providers\": {...}}")
        return data

    def load(self) -> AuthState:
        """Read the stored state if there is one. A corrupt one disables persistence
        (logged)."""
        if self.store is None:
            return self
        try:
            data = self._read()
            for name, raw in (data or {"providers": {}})["providers"].items():
                entry = self._entry(name)
                entry["last_good"] = raw.get("last_good")
                for pid, ps in (raw.get("profiles") or {}).items():
                    entry["profiles"][pid] = ProfileState(**ps)
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            self._providers.clear()
            self.persist = False
            self.problem = (f"auth state file {self.path} is corrupt ({exc}); profile "
                            f"cooldowns are kept in memory only until it is fixed or removed")
            log.error("auth_state_corrupt", path=str(self.path), error=str(exc)[:300])
        return self

    def _entry(self, provider: str) -> dict[str, Any]:
        return self._providers.setdefault(provider, {"last_good": None, "profiles": {}})

    def profile(self, provider: str, profile: str) -> ProfileState:
        return self._entry(provider)["profiles"].setdefault(profile, ProfileState())

    def last_good(self, provider: str) -> str | None:
        return self._entry(provider)["last_good"]

    def success(self, provider: str, profile: str, now: float) -> None:
        """A call on ``profile`` succeeded: clear its cooldown, make it last_good."""
        ps = self.profile(provider, profile)
        changed = bool(ps.failures or ps.cooldown_until) or self.last_good(provider) != profile
        ps.failures, ps.cooldown_until, ps.cooldown_class = 0, None, None
        ps.last_ok = ps.last_used = now
        self._entry(provider)["last_good"] = profile
        if changed:
            self.save()

    def failure(self, provider: str, profile: str, error_class: str, now: float,
                cooldown: float) -> None:
        """A failed attempt of ``error_class``; ``cooldown`` seconds benches the profile
        (0: it stays usable)."""
        ps = self.profile(provider, profile)
        ps.errors[error_class] = ps.errors.get(error_class, 0) + 1
        ps.failures += 1
        ps.last_error_class, ps.last_error_at, ps.last_used = error_class, now, now
        if cooldown > 0:
            ps.cooldown_until = max(ps.cooldown_until or 0.0, now + cooldown)
            ps.cooldown_class = error_class
        if self.last_good(provider) == profile and cooldown > 0:
            self._entry(provider)["last_good"] = None
        self.save()

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

    def save(self) -> None:
        if not self.recheck() or self.store is None:
            return
        data = json.dumps(self.snapshot(), indent=1, sort_keys=True).encode()
        try:
            self.store.write(data)
        except OSError as exc:
            log.error("auth_state_write_failed", path=str(self.path), error=str(exc))
