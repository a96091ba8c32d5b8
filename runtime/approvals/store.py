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
    while no turn waited (after a restart) was used by the same turn asking again;
    ``run_id``: the turn that asked (a resumed turn keeps its run id; no other turn may
    use the decision); ``replica``: on replicas, the one whose turn waits for it (or that expires it);
    ``tainted``: the asking turn was tainted (docs/exec.md "Tainted turns"): allowed once
    or denied, never "always allowed"; ``runs``: where an exec command runs, ``host`` or
    ``sandbox`` ("" for other tools)."""

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
    replica: str = ""
    run_id: str = ""
    tainted: bool = False
    runs: str = ""

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


class FileApprovals:
    """The approvals records of one host (:class:`ApprovalStore`) behind the interface the
    gateway uses (gateway/approvals/service.py); on replicas the PostgreSQL records
    (gateway/cluster/approvals.py) take its place. Every method is a coroutine.

    ``settle`` is the one way a request is decided: it changes a *pending* request and
    returns it, or returns None when it was no longer pending (someone else decided
    first). ``replica`` is "" here (one host: this process waits for every request)."""

    replica = ""

    def __init__(self, store: ApprovalStore) -> None:
        self.store = store

    async def add(self, req: ApprovalRequest) -> None:
        self.store.add(req)

    async def get(self, rid: str) -> ApprovalRequest | None:
        return self.store.get(rid)

    async def save(self, req: ApprovalRequest) -> None:
        """Store what changed on ``req`` besides its decision (its prompts)."""
        self.store.save()

    async def mine(self) -> list[ApprovalRequest]:
        """Pending requests this process expires when nobody answers them."""
        return self.store.pending()

    async def patterns(self, agent_id: str) -> list[str]:
        return self.store.patterns(agent_id)

    async def listing(self, recent: int = 50) -> dict[str, Any]:
        """``{"pending": [...], "recent": [...newest first], "always": {agent: [...]}}``."""
        decided = sorted((r for r in self.store.requests.values() if r.status != "pending"),
                         key=lambda r: r.decided_at or 0, reverse=True)[:recent]
        return {"pending": [r.to_dict() for r in self.store.pending()],
                "recent": [r.to_dict() for r in decided], "always": self.store.always}

    async def settle(self, rid: str, status: str, by: str | None, at: float, *,
                     always: bool = False, pattern: str | None = None,
                     mine_only: bool = False) -> ApprovalRequest | None:
        req = self.store.get(rid)
        if req is None or req.status != "pending":
            return None
        if pattern is not None:
            self.store.add_pattern(req.agent_id, pattern, by or "", at)
        req.status, req.decided_by, req.always, req.decided_at = status, by, always, at
        self.store.save()
        return req

    async def consume(self, rid: str) -> bool:
        """Mark an allowed request used; False when it was used already."""
        req = self.store.get(rid)
        if req is None or req.consumed:
            return False
        req.consumed = True
        self.store.save()
        return True

    async def reusable(self, session_key: str, command: str, now: float,
                       run_id: str) -> ApprovalRequest | None:
        """An unexpired request of ``session_key`` for ``command`` asked by the turn
        ``run_id``, pending or allowed and not used yet (that turn, resumed after a
        restart, asking again). Another turn never gets it: it asks for itself (it may be
        tainted where the asker was not). An empty ``run_id`` matches nothing."""
        for r in self.store.requests.values():
            if (run_id and r.run_id == run_id and r.session_key == session_key
                    and r.command == command and not r.consumed
                    and r.status in ("pending", "allowed") and r.expires_at > now):
                return r
        return None
