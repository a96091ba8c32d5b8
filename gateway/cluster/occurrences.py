"""Cron's occurrence ledger and heartbeat slots (issue 15 "Cron and heartbeat").

Every replica runs the same cron timer; before a scheduled run starts, its (job, due
time) is inserted into ``cluster_cron_runs`` (primary key (job_id, due_at)). Only the
insert that wins runs it, so a due time fires once cluster-wide. A row left ``running``
by a replica that died is taken over by a live replica (``orphans``) and run again as
a retry (``attempts`` counts them): never lost, never silently doubled. Heartbeats claim
``(agent, slot)`` the same way, slot = floor(epoch seconds / interval).

A run that waits for its session's lane (gateway/cluster/synthetic.py) checks once it
has it that the occurrence is still this replica's (``guard``): a replica paused past
the TTL while it waited comes back to find it retried elsewhere, and does not run it a
second time.
"""

from __future__ import annotations

from typing import Any

import structlog

from gateway.cluster import membership
from gateway.cluster.db import ClusterDB
from runtime.clock import parse_iso, utc_iso

log = structlog.get_logger(__name__)


def due_key(due_at: float) -> float:
    """``due_at`` at the job store's resolution (RFC 3339 milliseconds, the round trip is
    stable): the replica that created or edited a job holds its anchor to the microsecond,
    the others read it back from ``cron_jobs`` in milliseconds, and two keys for one due
    time would both win the insert (the job fired on both)."""
    return parse_iso(utc_iso(due_at))


class CronLedger:
    """The gate ``scheduler.cron.service.CronService`` asks (``claim``/``finished``)."""

    def __init__(self, db: ClusterDB, replica: str, ttl: float) -> None:
        self.db, self.me, self.ttl = db, replica, ttl
        self.claimed: dict[str, float] = {}  # job id -> due time claimed here, running

    async def claim(self, job_id: str, due_at: float) -> str | None:
        """None when this replica runs the occurrence, else the replica that has it.
        Waits out a PostgreSQL outage (running unclaimed could double it)."""
        due_at = due_key(due_at)

        async def go(conn: Any) -> str | None:
            won = await conn.fetchval(
                "INSERT INTO cluster_cron_runs (job_id, due_at, replica_id) VALUES ($1, $2, "
                "$3) ON CONFLICT DO NOTHING RETURNING true", job_id, due_at, self.me)
            if won:
                return None
            row = await conn.fetchrow("SELECT replica_id, state FROM cluster_cron_runs "
                                      "WHERE job_id = $1 AND due_at = $2", job_id, due_at)
            return None if row["replica_id"] == self.me and row["state"] == "running" \
                else row["replica_id"]
        holder = await self.db.retry(go, what="cron claim")
        if holder is None:
            self.claimed[job_id] = due_at
        return holder

    def guard(self, job_id: str, due_at: float | None) -> Any:
        """For the run of ``job_id`` due at ``due_at`` claimed here: an async callable
        -> whether the occurrence is still this replica's (not taken over), else None
        (a manual run, or not claimed here)."""
        if due_at is None or self.claimed.get(job_id) != due_key(due_at):
            return None
        due = due_key(due_at)

        async def still_mine() -> bool:
            return bool(await self.db.retry(lambda c: c.fetchval(
                "SELECT true FROM cluster_cron_runs WHERE job_id = $1 AND due_at = $2 AND "
                "replica_id = $3 AND state = 'running'", job_id, due, self.me),
                what="cron claim"))
        return still_mine

    async def finished(self, job_id: str, due_at: float, status: str) -> None:
        due_at = due_key(due_at)
        if self.claimed.get(job_id) == due_at:
            del self.claimed[job_id]
        await self.db.retry(lambda c: c.execute(
            "UPDATE cluster_cron_runs SET state = 'done', status = $4, finished_at = now() "
            "WHERE job_id = $1 AND due_at = $2 AND replica_id = $3", job_id, due_at, self.me,
            status), what="cron finish")

    async def orphans(self, busy: set[str] | frozenset[str] = frozenset()
                      ) -> list[tuple[str, float]]:
        """Take over occurrences left running by dead replicas, oldest first, at most one
        per job and none of the jobs in ``busy`` (running here); returns (job, due)."""
        async def go(conn: Any) -> list[Any]:
            async with conn.transaction():
                rows = await conn.fetch(
                    "SELECT job_id, due_at FROM cluster_cron_runs w WHERE state = 'running' "
                    "AND NOT EXISTS (SELECT 1 FROM cluster_replicas r WHERE "
                    f"r.id = w.replica_id AND {membership.alive('$1')}) ORDER BY due_at "
                    "FOR UPDATE SKIP LOCKED", self.db.peer_ttl(self.ttl))
                taken: list[Any] = []
                for r in rows:
                    if r["job_id"] in busy or any(t["job_id"] == r["job_id"] for t in taken):
                        continue
                    taken.append(await conn.fetchrow(
                        "UPDATE cluster_cron_runs SET replica_id = $3, attempts = attempts + 1,"
                        " claimed_at = now() WHERE job_id = $1 AND due_at = $2 "
                        "RETURNING job_id, due_at, attempts", r["job_id"], r["due_at"],
                        self.me))
                return taken
        rows = await self.db.run(go)
        for r in rows:
            log.warning("cron_occurrence_taken_over", job_id=r["job_id"], due_at=r["due_at"],
                        attempt=r["attempts"])
        return [(r["job_id"], r["due_at"]) for r in rows]


class HeartbeatSlots:
    """One heartbeat per agent per slot cluster-wide."""

    def __init__(self, db: ClusterDB, replica: str) -> None:
        self.db, self.me = db, replica

    async def claim(self, agent_id: str, now: float, interval: float) -> bool:
        slot = int(now // max(1.0, interval))
        return bool(await self.db.retry(lambda c: c.fetchval(
            "INSERT INTO cluster_heartbeat_slots (agent_id, slot, replica_id) VALUES ($1, $2,"
            " $3) ON CONFLICT DO NOTHING RETURNING true", agent_id, slot, self.me),
            what="heartbeat slot"))
