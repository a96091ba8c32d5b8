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
    replica: str | None = None  # shared storage: the replica that runs it

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
    """``runs.json``: ``load()`` -> records by run id; ``save(records)`` atomically.

    With ``records`` (``runtime.storage.postgres.subagents.PgRunRecords``: replicas) the
    records live in PostgreSQL instead: ``load()`` is this replica's runs, ``every()`` /
    ``of(key)`` / ``get(run_id)`` read every replica's (``shared`` is True)."""

    def __init__(self, path: Path, records: Any = None) -> None:
        self.path, self.records = path, records
        self.shared = records is not None
        if records is not None:
            self.path = records.path

    def _parse(self, rows: list[dict[str, Any]]) -> dict[str, RunRecord]:
        out: dict[str, RunRecord] = {}
        for i, row in enumerate(rows):
            try:
                rec = RunRecord.from_json(row)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise CorruptRunsFile(self.path, f"runs[{i}]: {exc}") from None
            out[rec.run_id] = rec
        return out

    def _shared(self, read: Any, *args: Any) -> dict[str, RunRecord]:
        try:
            return self._parse(read(*args))
        except OSError as exc:
            raise CorruptRunsFile(self.path, str(exc)) from None

    def every(self) -> list[RunRecord]:
        """Every run record (every replica's when shared). Raises CorruptRunsFile (also
        for a PostgreSQL that cannot be read)."""
        rows = self._shared(self.records.all) if self.shared else self.load()
        return list(rows.values())

    def of(self, requester_key: str) -> list[RunRecord]:
        """The runs a session requested (any replica's when shared). Raises
        CorruptRunsFile."""
        if self.shared:
            return list(self._shared(self.records.of, requester_key).values())
        return [r for r in self.load().values() if r.requester_session_key == requester_key]

    def get(self, run_id: str) -> RunRecord | None:
        """One run record or None (any replica's when shared). Raises CorruptRunsFile."""
        if not self.shared:
            return self.load().get(run_id)
        row = self._shared(lambda: [r for r in [self.records.get(run_id)] if r])
        return row.get(run_id)

    def load(self) -> dict[str, RunRecord]:
        """Raises CorruptRunsFile for unreadable JSON, a wrong shape or a bad record; a
        missing file is no runs. Shared: this replica's runs."""
        if self.shared:
            return self._shared(self.records.load)
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise CorruptRunsFile(self.path, f"not readable JSON: {exc}") from None
        runs = data.get("runs") if isinstance(data, dict) else None
        if not isinstance(runs, list):
            raise CorruptRunsFile(self.path, "expected {\"version\": 1, \"runs\": [...]}")
        return self._parse(runs)

    def save(self, records: dict[str, RunRecord]) -> None:
        """Replace the file atomically; shared: queue the changed records (returns at
        once, written in the background and retried through an outage)."""
        if self.shared:
            self.records.save([r.to_json() for r in records.values()])
            return
        payload = {"version": VERSION, "runs": [r.to_json() for r in records.values()]}
        atomic_write(self.path, json.dumps(payload, ensure_ascii=False, indent=1).encode(),
                     mode=0o600)
