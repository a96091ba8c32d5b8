"""Exec approvals on replicas (docs/exec.md "On replicas"): the requests and "always
allow" patterns live in PostgreSQL (tables ``approval_requests``, ``approval_patterns``,
migration 0160), so any replica lists them and any replica decides them.

- A decision is one ``UPDATE ... WHERE status = 'pending'`` (:meth:`PgApprovals.settle`):
  of two presses on two replicas, or a press and ``tidegate approvals allow`` elsewhere,
  exactly one wins; the others are told it was already decided. The same transaction
  sends ``NOTIFY tidegate_approvals`` with the request id.
- The replica named in the row's ``replica`` (the one whose turn waits) takes the
  decision from the notification (:meth:`ClusterApprovals.notified`; each cluster tick
  re-reads its waiting requests too, in case a notification was lost) and resumes the
  turn; it records the decision in the session's timeline.
- A request whose replica died (no heartbeat for the lease TTL) is taken over by a live
  replica, which expires it as a deny with a notice when nobody answers; a turn of the
  session that asks again (the lane's new replica resuming it) takes it over too and
  waits for it, or uses the decision made meanwhile (once).
- Messages with buttons for an account another replica runs go through that replica
  (gateway/cluster/buttons.py).
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from gateway.cluster import membership
from runtime.approvals.store import ApprovalRequest

CHANNEL = "tidegate_approvals"  # NOTIFY payload: the decided request's id
RECENT_KEEP = 200  # decided requests kept for listings, per the embedded store's rule


def _req(row: Any) -> ApprovalRequest:
    d = json.loads(row["request"])
    d.update(status=row["status"], consumed=row["consumed"], replica=row["replica"])
    return ApprovalRequest.from_dict(d)


class PgApprovals:
    """``gateway/approvals`` records on PostgreSQL (interface: runtime/approvals/store.py
    :class:`FileApprovals`). ``db`` is the replica's ClusterDB; ``replica`` its id."""

    def __init__(self, db: Any, replica: str, ttl: float) -> None:
        self.db, self.replica, self.ttl = db, replica, ttl

    async def add(self, req: ApprovalRequest) -> None:
        req.replica = self.replica
        await self.db.retry(lambda c: c.execute(
            "INSERT INTO approval_requests (id, session_key, command, replica, status, "
            "requested_at, request) VALUES ($1, $2, $3, $4, 'pending', $5, $6::jsonb)",
            req.id, req.session_key, req.command, req.replica, req.requested_at,
            json.dumps(req.to_dict())), what="approval")

    async def get(self, rid: str) -> ApprovalRequest | None:
        row = await self.db.run(lambda c: c.fetchrow(
            "SELECT * FROM approval_requests WHERE id = $1", rid))
        return _req(row) if row is not None else None

    async def save(self, req: ApprovalRequest) -> None:
        """Store ``req.prompts`` (the only field that changes besides the decision)."""
        await self.db.retry(lambda c: c.execute(
            "UPDATE approval_requests SET request = jsonb_set(request, '{prompts}', "
            "$2::jsonb) WHERE id = $1", req.id, json.dumps(req.prompts)), what="approval")

    async def mine(self) -> list[ApprovalRequest]:
        rows = await self.db.run(lambda c: c.fetch(
            "SELECT * FROM approval_requests WHERE status = 'pending' AND replica = $1 "
            "ORDER BY requested_at", self.replica))
        return [_req(r) for r in rows]

    async def adopt(self) -> list[ApprovalRequest]:
        """Pending requests of dead replicas become this replica's (to expire them)."""
        ttl = self.db.peer_ttl(self.ttl)
        rows = await self.db.run(lambda c: c.fetch(
            "UPDATE approval_requests a SET replica = $1 WHERE id IN (SELECT q.id FROM "
            "approval_requests q WHERE q.status = 'pending' AND q.replica <> $1 AND NOT "
            "EXISTS (SELECT 1 FROM cluster_replicas r WHERE r.id = q.replica AND "
            f"{membership.alive('$2')}) FOR UPDATE SKIP LOCKED) RETURNING a.*",
            self.replica, ttl))
        return [_req(r) for r in rows]

    async def patterns(self, agent_id: str) -> list[str]:
        rows = await self.db.run(lambda c: c.fetch(
            "SELECT pattern FROM approval_patterns WHERE agent_id = $1 ORDER BY at",
            agent_id))
        return [r["pattern"] for r in rows]

    async def listing(self, recent: int = 50) -> dict[str, Any]:
        async def go(c: asyncpg.Connection) -> dict[str, Any]:
            pending = await c.fetch("SELECT * FROM approval_requests WHERE status = "
                                    "'pending' ORDER BY requested_at")
            decided = await c.fetch("SELECT * FROM approval_requests WHERE status <> "
                                    "'pending' ORDER BY decided_at DESC NULLS LAST LIMIT $1",
                                    recent)
            pats = await c.fetch("SELECT * FROM approval_patterns ORDER BY at")
            always: dict[str, list[dict[str, Any]]] = {}
            for p in pats:
                always.setdefault(p["agent_id"], []).append(
                    {"pattern": p["pattern"], "by": p["decided_by"], "at": p["at"]})
            return {"pending": [_req(r).to_dict() for r in pending],
                    "recent": [_req(r).to_dict() for r in decided], "always": always}
        return await self.db.run(go)

    async def settle(self, rid: str, status: str, by: str | None, at: float, *,
                     always: bool = False, pattern: str | None = None,
                     mine_only: bool = False) -> ApprovalRequest | None:
        """Decide a pending request (compare-and-set; module docstring). ``mine_only``:
        only while it is this replica's (an expiry)."""
        patch = json.dumps({"decided_by": by, "decided_at": at, "always": always,
                            "status": status})

        async def go(c: asyncpg.Connection) -> Any:
            async with c.transaction():
                row = await c.fetchrow(
                    "UPDATE approval_requests SET status = $2, decided_at = $3, request = "
                    "request || $4::jsonb WHERE id = $1 AND status = 'pending' AND "
                    "(NOT $5 OR replica = $6) RETURNING *", rid, status, at, patch,
                    mine_only, self.replica)
                if row is None:
                    return None
                if pattern is not None:
                    agent = json.loads(row["request"])["agent_id"]
                    await c.execute("INSERT INTO approval_patterns (agent_id, pattern, "
                                    "decided_by, at) VALUES ($1, $2, $3, $4) ON CONFLICT "
                                    "DO NOTHING", agent, pattern, by or "", at)
                await c.execute("SELECT pg_notify($1, $2)", CHANNEL, rid)
                await c.execute(
                    "DELETE FROM approval_requests WHERE id IN (SELECT id FROM "
                    "approval_requests WHERE status <> 'pending' ORDER BY decided_at DESC "
                    "OFFSET $1)", RECENT_KEEP)
                return row
        row = await self.db.retry(go, what="approval")
        return _req(row) if row is not None else None

    async def consume(self, rid: str) -> bool:
        return bool(await self.db.retry(lambda c: c.fetchval(
            "UPDATE approval_requests SET consumed = true WHERE id = $1 AND NOT consumed "
            "RETURNING true", rid), what="approval"))

    async def reusable(self, session_key: str, command: str, now: float,
                       run_id: str) -> ApprovalRequest | None:
        """As on one host; the request becomes this replica's (the session's turns run
        here now)."""
        row = await self.db.retry(lambda c: c.fetchrow(
            "UPDATE approval_requests SET replica = $4 WHERE id = (SELECT id FROM "
            "approval_requests WHERE session_key = $1 AND command = $2 AND NOT consumed "
            "AND status IN ('pending', 'allowed') AND (request->>'expires_at')::float8 > $3 "
            "AND $5 <> '' AND request->>'run_id' = $5 "
            "ORDER BY requested_at DESC LIMIT 1 FOR UPDATE) RETURNING *",
            session_key, command, now, self.replica, run_id), what="approval")
        return _req(row) if row is not None else None


class ClusterApprovals:
    """Hooks the PostgreSQL records into the gateway's approvals (``gw.approvals``):
    ``NOTIFY`` wakes the waiting replica, :meth:`tick` is the fallback and the takeover."""

    def __init__(self, gw: Any, db: Any, replica: str, ttl: float) -> None:
        self.approvals = gw.approvals
        self.records = PgApprovals(db, replica, ttl)
        self.approvals.records = self.records
        db.listen(CHANNEL, self._on_notify)

    def _on_notify(self, rid: str) -> None:
        self.approvals.spawn(self.approvals.notified(rid))

    async def tick(self) -> None:
        """Re-read the requests waited for here (a lost notification), and take over the
        pending requests of dead replicas (to expire them unless answered)."""
        for rid in self.approvals.waiting():
            await self.approvals.notified(rid)
        for req in await self.records.adopt():
            self.approvals.adopted(req)
