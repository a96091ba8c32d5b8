"""Subagent run records and their file ``<state_dir>/subagents/runs.json`` (seed 001 §6
"SubagentRunRecord").

File: ``{"version": 1, "runs": [record, ...]}``, replaced atomically on every change;
times are RFC 3339 UTC strings. A record::

    run_id, child_session_key, requester_session_key, requester_session_id, agent_id,
    task, label, cleanup (keep|delete), spawn_mode ("run"), model, timeout (s), depth,
    created_at, started_at, ended_at, outcome {status, error?, text?},
    announce_retry_count, announce_state (pending|announced|failed|expired|skipped),
    announced_at

``outcome.status``: ok | error | timeout | interrupted | killed | refused (the usage
budget stopped the run before its model call; ``error`` says why); no outcome while the
run is queued or running.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from runtime.clock import parse_iso, utc_iso
from runtime.fsutil import atomic_write

VERSION = 1
_TIMES = ("created_at", "started_at", "ended_at", "announced_at")


class CorruptRunsFile(Exception):
    """runs.json cannot be read as run records; ``path`` names the file."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


@dataclass(slots=True)
class RunRecord:
    """One subagent run (module docstring). Times are epoch seconds."""

    run_id: str
    child_session_key: str
    requester_session_key: str
    requester_session_id: str
    agent_id: str
    task: str
    created_at: float
    label: str | None = None
    cleanup: str = "keep"
    spawn_mode: str = "run"
    model: str | None = None
    timeout: float | None = None
    depth: int = 1
    started_at: float | None = None
    ended_at: float | None = None
    outcome: dict[str, Any] | None = None
    announce_retry_count: int = 0
    announce_state: str = "pending"
    announced_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.outcome:
            return str(self.outcome.get("status"))
        return "running" if self.started_at is not None else "queued"

    @property
    def active(self) -> bool:
        return self.ended_at is None

    def end(self, now: float, status: str, *, text: str | None = None,
            error: str | None = None) -> None:
        """Set the outcome once (a later end of an ended run is ignored)."""
        if self.ended_at is not None:
            return
        self.ended_at = now
        self.outcome = {"status": status, **({"text": text} if text else {}),
                        **({"error": error} if error else {})}

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in _TIMES:
            d[k] = utc_iso(d[k]) if d[k] is not None else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunRecord:
        """Raises KeyError/TypeError/ValueError for a malformed record."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in d.items() if k in known}
        for k in _TIMES:
            if data.get(k) is not None:
                data[k] = parse_iso(data[k])
        rec = cls(**data)
        if not isinstance(rec.run_id, str) or not isinstance(rec.child_session_key, str):
            raise ValueError("run_id and child_session_key must be strings")
        return rec


class RunStore:
    """``runs.json``: ``load()`` -> records by run id; ``save(records)`` atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, RunRecord]:
        """Raises CorruptRunsFile for unreadable JSON, a wrong shape or a bad record; a
        missing file is no runs."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise CorruptRunsFile(self.path, f"not readable JSON: {exc}") from None
        runs = data.get("runs") if isinstance(data, dict) else None
        if not isinstance(runs, list):
            raise CorruptRunsFile(self.path, "expected {\"version\": 1, \"runs\": [...]}")
        out: dict[str, RunRecord] = {}
        for i, row in enumerate(runs):
            try:
                rec = RunRecord.from_json(row)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise CorruptRunsFile(self.path, f"runs[{i}]: {exc}") from None
            out[rec.run_id] = rec
        return out

    def save(self, records: dict[str, RunRecord]) -> None:
        payload = {"version": VERSION, "runs": [r.to_json() for r in records.values()]}
        atomic_write(self.path, json.dumps(payload, ensure_ascii=False, indent=1).encode(),
                     mode=0o600)
