"""What a config reload (SIGHUP) can apply live, what needs a restart, and how the last
reload went (:class:`ReloadReport`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.config.schema import Config
from runtime.clock import utc_iso

# Sections bound to sockets, files or connections opened at start.
RESTART_ONLY = (
    ("gateway", "state_dir"), ("gateway", "bind"), ("gateway", "port"), ("logging", None),
    ("channels", None), ("lanes", None), ("timeline", None), ("storage", None),
    ("cluster", None), ("metrics", None), ("telemetry", None),  # the exporters start once
)


def restart_required(old: Config, new: Config) -> list[str]:
    """Dotted names of changed settings that only take effect after a restart."""
    changed: list[str] = []
    for section, key in RESTART_ONLY:
        a, b = getattr(old, section), getattr(new, section)
        if key is not None:
            a, b = getattr(a, key), getattr(b, key)
        if a != b:
            changed.append(f"{section}.{key}" if key else section)
    return changed


@dataclass
class ReloadReport:
    """The outcome of the last config reload (SIGHUP), shown in ``status`` problems,
    ``/readyz`` and the control UI's Problems view until a later reload succeeds.
    Times are epoch seconds."""

    failed_at: float | None = None
    error: str = ""
    applied_at: float | None = None
    restart_required: list[str] = field(default_factory=list)
    env_changed: list[str] = field(default_factory=list)
    count: int = 0  # reloads finished, failed or not (`gateway reload` waits for it to move)

    def failed(self, at: float, problems: list[str]) -> None:
        """A reload refused (``problems``: the config errors, first one shown)."""
        self.count += 1
        self.failed_at = at
        self.error = problems[0] if problems else "unknown error"

    def succeeded(self, at: float, restart_required: list[str],
                  env_changed: list[str]) -> None:
        """A reload applied; ``restart_required``: changed settings that wait for a
        restart; ``env_changed``: env-file variable names whose value changed."""
        self.count += 1
        self.failed_at, self.error = None, ""
        self.applied_at = at
        self.restart_required = list(restart_required)
        self.env_changed = list(env_changed)

    def problems(self) -> list[str]:
        """At most one line: the failed reload, else settings waiting for a restart."""
        if self.failed_at is not None:
            return [(f"reload at {_when(self.failed_at)} failed: {self.error}; still "
                     "running the previous config")]
        if self.applied_at is not None and self.restart_required:
            return [(f"reload at {_when(self.applied_at)} changed "
                     f"{', '.join(self.restart_required)}: only a restart applies "
                     "that (tidegate gateway restart)")]
        return []

    def status(self) -> dict[str, Any]:
        """The ``reload`` object of ``GET /status``."""
        return {"count": self.count,
                "failed_at": _when(self.failed_at) if self.failed_at else None,
                "error": self.error or None,
                "applied_at": _when(self.applied_at) if self.applied_at else None,
                "restart_required": self.restart_required, "env_changed": self.env_changed}


def _when(epoch: float) -> str:
    return utc_iso(epoch)[:19] + "Z"  # to the second: what an operator reads
