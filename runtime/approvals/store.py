"""The approvals file (``<state_dir>/approvals.json``, 0600, replaced atomically): the
"always allow" patterns per agent and the approval requests, pending ones included, so a
request survives a restart (still answerable until it expires).

Shape: ``{"version": 1, "always": {<agent>: [{"pattern", "by", "at"}]},
"requests": [<ApprovalRequest.to_dict()>]}``; times are epoch seconds. Decided requests
are kept (newest :data:`KEEP_DECIDED`) for ``tidegate approvals list``. A file that cannot
be read is moved aside (``approvals.json.corrupt-<ts>``) and logged; approvals start empty
(only this store is affected).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from runtime.fsutil import atomic_write

log = structlog.get_logger(__name__)

FILE = "approvals.json"
KEEP_DECIDED = 200
STATUSES = ("pending", "allowed", "denied", "expired")


@dataclass(slots=True)
class ApprovalRequest:
    """One request. ``status``: pending | allowed | denied | expired; ``decided_by`` a
    canonical sender id (``telegram:1001``) or ``operator:cli`` / ``operator:api``;
    ``always``: the approver chose "always allow"; ``reason``: why it asks (not in the
    allowlist, what tainted the turn...); ``prompts``: the messages with buttons sent to
    approvers (``{channel, account, to, message_id}``); ``consumed``: a decision taken
    while no turn waited (after a restart) was used by the next identical request."""

    id: str
    agent_id: str
    session_key: str
    session_id: str
    tool: str
    command: str
    argv: list[str] | None
    binary: str | None
    reason: str
    requested_at: float
    expires_at: float
    approvers: list[str]
    status: str = "pending"
    decided_by: str | None = None
    decided_at: float | None = None
    always: bool = False
    prompts: list[dict[str, str]] = field(default_factory=list)
    consumed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ApprovalRequest:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


class ApprovalStore:
    """The approvals file of one state dir (module docstring). Not thread-safe: used from
    the event loop only; every change is written before the call returns."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE
        self.always: dict[str, list[dict[str, Any]]] = {}
        self.requests: dict[str, ApprovalRequest] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text("utf-8"))
            always = {str(a): [dict(p) for p in pats] for a, pats in data["always"].items()}
            requests = [ApprovalRequest.from_dict(r) for r in data["requests"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(f"{FILE}.corrupt-{secrets.token_hex(3)}")
            self.path.replace(aside)
            log.error("approvals_store_corrupt", path=str(self.path), moved_to=str(aside),
                      error=f"{type(exc).__name__}: {exc}")
            return
        self.always = always
        self.requests = {r.id: r for r in requests}

    def save(self) -> None:
        decided = sorted((r for r in self.requests.values() if r.status != "pending"),
                         key=lambda r: r.requested_at)
        for old in decided[:max(0, len(decided) - KEEP_DECIDED)]:
            del self.requests[old.id]
        data = {"version": 1, "always": self.always,
                "requests": [r.to_dict() for r in self.requests.values()]}
        atomic_write(self.path, json.dumps(data, indent=1).encode())

    def new_id(self) -> str:
        while (rid := secrets.token_hex(4)) in self.requests:
            pass
        return rid

    def add(self, req: ApprovalRequest) -> None:
        self.requests[req.id] = req
        self.save()

    def get(self, rid: str) -> ApprovalRequest | None:
        return self.requests.get(rid)

    def pending(self) -> list[ApprovalRequest]:
        return sorted((r for r in self.requests.values() if r.status == "pending"),
                      key=lambda r: r.requested_at)

    def patterns(self, agent_id: str) -> list[str]:
        return [p["pattern"] for p in self.always.get(agent_id, [])]

    def add_pattern(self, agent_id: str, pattern: str, by: str, at: float) -> None:
        if pattern not in self.patterns(agent_id):
            self.always.setdefault(agent_id, []).append({"pattern": pattern, "by": by,
                                                         "at": at})
        self.save()
