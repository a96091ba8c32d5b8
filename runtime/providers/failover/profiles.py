"""Auth profiles of every provider (seed 001 §2.3): rotation order, availability,
cooldowns and what status shows — one gateway-wide instance shared by every agent.

``models.providers.<p>.auth_profiles`` gives the rotation order; the profile that last
answered (``last_good``) is tried first. A provider with a plain ``api_key`` (or none, for
local servers) has one profile called ``default``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from runtime.clock import Clock, utc_iso
from runtime.providers.failover.credentials import Credential
from runtime.providers.failover.state import AuthState

DEFAULT_PROFILE = "default"


@dataclass(slots=True)
class FailoverSettings:
    """``models.*`` knobs: attempts cap per turn, longest Retry-After honoured in place
    (seconds), retries per profile for timeout/transient/rate-limit, base backoff
    (seconds, doubled per retry, with jitter) and cooldowns per error class (seconds)."""

    max_attempts: int = 160
    max_retry_wait: float = 60.0
    retries: int = 2
    backoff: float = 1.0
    cooldowns: Mapping[str, float] | None = None

    def cooldown(self, error_class: str) -> float:
        defaults = {"billing": 5 * 3600.0, "auth": 3600.0, "rate_limit": 60.0}
        table = {**defaults, **(self.cooldowns or {})}
        return float(table.get(error_class, table.get("transient", 0.0)))


def credentials_from_config(name: str, entry: Mapping[str, Any],
                            env: Mapping[str, str] | None = None) -> list[Credential]:
    """The profiles of one ``models.providers.<name>`` entry, in rotation order."""
    profiles = entry.get("auth_profiles") or []
    if not profiles:
        return [Credential(name, DEFAULT_PROFILE, "key", entry.get("api_key") or "not-needed")]
    out = []
    for p in profiles:
        for kind, key in (("key", "api_key"), ("env", "api_key_env"),
                          ("command", "api_key_command")):
            if p.get(key):
                out.append(Credential(name, p["id"], kind, p[key], env=env))
                break
    return out


class AuthProfiles:
    """Profiles of every configured provider plus their persisted state.

    ``providers_config`` is ``models.providers`` as plain dicts; ``state_path`` is
    ``<state_dir>/auth-state.json`` (None: memory only)."""

    def __init__(self, providers_config: Mapping[str, Mapping[str, Any]] | None, *,
                 clock: Clock, settings: FailoverSettings | None = None,
                 state_path: Path | None = None,
                 env: Mapping[str, str] | None = None, state_records: Any = None) -> None:
        self.clock = clock
        # state_records: a runtime.storage.documents backend in place of the file
        self.state = AuthState(state_path, state_records).load()
        self.env = env
        self._creds: dict[str, list[Credential]] = {}
        self.answers: dict[str, dict[str, Any]] = {}  # agent id -> who answered last
        self.configure(providers_config, settings)

    def configure(self, providers_config: Mapping[str, Mapping[str, Any]] | None,
                  settings: FailoverSettings | None = None) -> None:
        """(Re)load profiles (SIGHUP). Command tokens of unchanged profiles are kept."""
        old = {(c.provider, c.profile, c.kind, c.source): c
               for creds in self._creds.values() for c in creds}
        self.settings = settings or FailoverSettings()
        self._creds = {}
        for name, entry in (providers_config or {}).items():
            creds = credentials_from_config(name, entry, self.env)
            self._creds[name] = [old.get((c.provider, c.profile, c.kind, c.source), c)
                                 for c in creds]

    def order(self, provider: str) -> list[Credential]:
        """``provider``'s profiles in the order to try: last_good first, then config order.
        Unknown providers (``echo``) get one keyless profile."""
        creds = self._creds.get(provider)
        if creds is None:
            return [Credential(provider, DEFAULT_PROFILE, "key", "")]
        good = self.state.last_good(provider)
        return sorted(creds, key=lambda c: c.profile != good)

    def cooling(self, provider: str, profile: str) -> float:
        """Seconds of cooldown left for a profile (0: usable, or half-open again)."""
        return self.state.profile(provider, profile).cooling(self.clock.time())

    def would_use(self, chain: list[str]) -> tuple[str, str] | None:
        """(model ref, profile id) a call would try first now; None when all are cooling."""
        for ref in chain:
            provider = ref.split("/", 1)[0]
            for cred in self.order(provider):
                if not self.cooling(provider, cred.profile):
                    return ref, cred.profile
        return None

    def reset(self, name: str) -> list[str]:
        """Put benched profiles back in service (``tidegate models reset``): ``name`` is
        ``<provider>/<profile>``, a profile id (unique across providers) or a provider
        (all of its profiles). Returns the ``provider/profile`` names reset; raises
        LookupError naming the known ones for an unknown ``name``."""
        every = [(p, c.profile) for p, creds in self._creds.items() for c in creds]
        hits = [(p, pid) for p, pid in every
                if name in (f"{p}/{pid}", pid, p)]
        if not hits:
            known = ", ".join(f"{p}/{pid}" for p, pid in every) or "none configured"
            raise LookupError(f"no auth profile {name!r} (known: {known})")
        now = self.clock.time()
        for provider, profile in hits:
            self.state.reset(provider, profile, now)
        done = [f"{p}/{pid}" for p, pid in hits]
        structlog.get_logger(__name__).warning("auth_profile_reset", profiles=done)
        return done

    # -- what operators see ----------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """``{"providers": {name: {"last_good", "profiles": [{id, source, state,
        cooldown_left_s, cooldown_class, last_error_class, errors, failures, last_used,
        last_ok, token_expires_in_s}]}}, "agents": {id: last answer}, "persistence"}``."""
        now = self.clock.time()
        self.state.recheck()  # a removed/repaired corrupt file: persistence resumes
        out: dict[str, Any] = {}
        for name, creds in self._creds.items():
            rows = []
            for c in creds:
                ps = self.state.profile(name, c.profile)
                left = ps.cooling(now)
                state = "cooling" if left else ("failing" if ps.failures else "ok")
                rows.append({"id": c.profile, "source": c.describe(), "state": state,
                             "cooldown_left_s": round(left), "cooldown_class":
                             ps.cooldown_class if left else None,
                             "last_error_class": ps.last_error_class, "errors": ps.errors,
                             "failures": ps.failures, "last_used": _iso(ps.last_used),
                             "last_ok": _iso(ps.last_ok),
                             "token_expires_in_s": None if c.expires_at is None
                             else round(c.expires_at - now)})
            out[name] = {"last_good": self.state.last_good(name), "profiles": rows}
        return {"providers": out, "agents": dict(self.answers),
                "persistence": "disabled" if self.state.problem else
                ("memory" if self.state.store is None else
                 "postgresql" if isinstance(self.state.path, str) else "file")}

    def problems(self) -> list[str]:
        """One line per provider profile that is failing or cooling down right now."""
        providers = self.status()["providers"]
        lines = [self.state.problem] if self.state.problem else []
        for name, info in providers.items():
            for p in info["profiles"]:
                if p["state"] == "ok":
                    continue
                what = (f"cooling down {_left(p['cooldown_left_s'])} after {p['cooldown_class']}"
                        if p["state"] == "cooling" else
                        f"failing ({p['failures']} in a row, last {p['last_error_class']})")
                lines.append(f"model provider {name} profile {p['id']}: {what}")
        return lines

    def report(self, chains: Mapping[str, list[str]]) -> dict[str, Any]:
        """:meth:`status` plus, per agent (``chains``: agent id -> model refs, primary
        first), its primary, fallbacks, what it would use now and what answered last."""
        out = self.status()
        out["chains"] = {}
        for agent_id, chain in chains.items():
            now = self.would_use(chain)
            out["chains"][agent_id] = {
                "primary": chain[0], "fallbacks": chain[1:],
                "would_use": {"model": now[0], "profile": now[1]} if now else None,
                "last_answer": self.answers.get(agent_id)}
        return out

    def note_answer(self, agent_id: str, ref: str, provider: str, profile: str) -> None:
        self.answers[agent_id] = {"model": ref, "provider": provider, "profile": profile,
                                  "at": utc_iso(self.clock.time())}


def _iso(epoch: float | None) -> str | None:
    return utc_iso(epoch) if epoch else None


def _left(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{(s % 3600) // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
