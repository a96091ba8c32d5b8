"""Fencing (issue 15 "Replicas"): a replica that lost a lease — paused (SIGSTOP, a long
GC or VM stall) or cut off from PostgreSQL past ``cluster.lease_ttl`` while another
replica took over — must not go on writing or sending as the owner. Every write that
matters carries its fence in the same statement or transaction, so the check and the
write cannot be separated by a takeover:

- work rows (journal marks, the reply mark, tool marks): ``target = <this replica>``; a
  takeover moves ``target`` in the same transaction as it takes the lane lease. The reply
  mark is all-or-none and, refused, raises :class:`LeaseLost`: the reply is not sent (the
  replica that took the rows over answers them).
- intake fast path ("running here" without the lease round trip): only while the lane
  lease row still names this replica.
- account leases (Telegram offset commit, the outbound drain claim): the lease
  generation (``0101_lease_fencing.sql``), a fencing token that is new whenever the lease
  changes hands, so a lease that came back to this replica later does not revive an old
  owner's writes. See :func:`membership.holds`.
"""

from __future__ import annotations

import json
import time
from typing import Any

import asyncpg


class LeaseLost(RuntimeError):
    """This replica no longer holds what it was acting on (fencing refused the write)."""


# Every mark is fenced by ``target``: a takeover moves the row to another replica in the
# same transaction as it takes the lane lease, so a replica that lost the row (paused past
# the lease TTL, cut off) cannot mark it any more.
MARKS = {
    # $3: the run id of each row of $1 (the turn it runs in: merged rows share one)
    "started": "UPDATE cluster_work w SET started = true, attempts = attempts + 1, "
               "run_id = u.run FROM unnest($1::bigint[], $3::text[]) AS u(id, run) "
               "WHERE w.id = u.id AND w.target = $2",
    "done": "UPDATE cluster_work SET state = 'done', done_at = now() "
            "WHERE id = ANY($1::bigint[]) AND state <> 'done' AND target = $2",
}
ACCEPT = (
    "INSERT INTO cluster_work (session_key, dedupe, work, target, state) SELECT $1, $2, "
    "$3::jsonb, $4, CASE WHEN $5 AND EXISTS (SELECT 1 FROM cluster_leases WHERE name = "
    "'lane:' || $1 AND replica_id = $4 FOR SHARE) THEN 'running' ELSE 'accepted' END "
    # a retry of this very accept (its answer lost after the commit: same message, same
    # run id) gets its row back; a redelivery (a new run id) gets none: a duplicate
    "ON CONFLICT (dedupe) DO UPDATE SET dedupe = EXCLUDED.dedupe WHERE "
    "cluster_work.work ->> 'run_id' = EXCLUDED.work ->> 'run_id' RETURNING id, state")


async def mark_replying(conn: asyncpg.Connection, ids: list[int], me: str,
                        reply: dict[str, Any] | None = None) -> bool:
    """Mark the rows "reply may be out" (``reply``: {text, key, stream} being sent; ``ts``
    is added) in one transaction, all or none: True when every row is still running
    here."""
    doc = json.dumps({**reply, "ts": time.time()}, ensure_ascii=False) if reply else None
    try:
        async with conn.transaction():
            got = await conn.fetch("UPDATE cluster_work SET replying = true, reply = "
                                   "$3::jsonb WHERE id = ANY($1::bigint[]) AND target = $2 "
                                   "AND state = 'running' RETURNING id", ids, me, doc)
            if len(got) != len(set(ids)):
                raise _Rollback
    except _Rollback:
        return False
    return True


class _Rollback(Exception):
    """Leaves a transaction without committing what it wrote."""


async def write_marks(conn: asyncpg.Connection, batch: dict[str, list[int]],
                      me: str, runs: dict[int, str] | None = None) -> set[int]:
    """Write the marks of ``batch`` (kind -> row ids; ``runs``: the run id of each
    started row); returns the ids whose ``started`` mark was refused (the row is no
    longer this replica's: taken over)."""
    refused: set[int] = set()
    for kind in ("started", "done"):  # in the order a turn makes them
        if batch.get(kind) and kind == "started":
            ids = batch[kind]
            got = await conn.fetch(MARKS[kind] + " RETURNING w.id", ids, me,
                                   [(runs or {}).get(i) for i in ids])
            refused = set(ids) - {r["id"] for r in got}
        elif batch.get(kind):
            await conn.execute(MARKS[kind], batch[kind], me)
    return refused


class LaneFences:
    """The lane lease generation each session's writes carry (issue 15 "Lanes"): the
    timeline append and the session-store row of a key whose lane this replica runs are
    refused by PostgreSQL unless the lane lease still has that holder and generation
    (``runtime/storage/postgres/fence.py``).

    A lane taken here records its generation; given back (idle) it is forgotten, so
    later writes (a heartbeat, cron) go unfenced as on one host; lost (a pause, a takeover
    seen) it is kept while a turn of that key still runs here, so that stale turn's writes
    carry the old generation and are refused."""

    def __init__(self, replica: str, busy: Any) -> None:
        self.me, self.busy = replica, busy  # busy(key): a local turn of key runs
        self._held: dict[str, int] = {}
        self._lost: dict[str, int] = {}

    def took(self, key: str, generation: int) -> None:
        self._held[key] = generation
        self._lost.pop(key, None)

    def holds(self, key: str) -> bool:
        """Whether the lane of ``key`` was taken here and not lost or given back since."""
        return key in self._held

    def released(self, key: str) -> None:
        self._held.pop(key, None)

    def lost(self, key: str) -> None:
        if key in self._held:
            self._lost[key] = self._held.pop(key)

    def token(self, key: str) -> tuple[str, str, int] | None:
        """``(lease name, replica, generation)`` for a write of ``key`` now, or None."""
        if key in self._held:
            return "lane:" + key, self.me, self._held[key]
        if key in self._lost:
            if self.busy(key):
                return "lane:" + key, self.me, self._lost[key]
            del self._lost[key]  # the stale turn is over
        return None
