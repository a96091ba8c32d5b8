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

import asyncpg


class LeaseLost(RuntimeError):
    """This replica no longer holds what it was acting on (fencing refused the write)."""


# Every mark is fenced by ``target``: a takeover moves the row to another replica in the
# same transaction as it takes the lane lease, so a replica that lost the row (paused past
# the lease TTL, cut off) cannot mark it any more.
MARKS = {
    "started": "UPDATE cluster_work SET started = true, attempts = attempts + 1 "
               "WHERE id = ANY($1::bigint[]) AND target = $2",
    "done": "UPDATE cluster_work SET state = 'done', done_at = now() "
            "WHERE id = ANY($1::bigint[]) AND state <> 'done' AND target = $2",
}
ACCEPT = (
    "INSERT INTO cluster_work (session_key, dedupe, work, target, state) SELECT $1, $2, "
    "$3::jsonb, $4, CASE WHEN $5 AND EXISTS (SELECT 1 FROM cluster_leases WHERE name = "
    "'lane:' || $1 AND replica_id = $4 FOR SHARE) THEN 'running' ELSE 'accepted' END "
    "ON CONFLICT (dedupe) DO NOTHING RETURNING id, state")


async def mark_replying(conn: asyncpg.Connection, ids: list[int], me: str) -> bool:
    """Mark the rows "reply may be out" in one transaction, all or none: True when every
    row is still running here."""
    try:
        async with conn.transaction():
            got = await conn.fetch("UPDATE cluster_work SET replying = true WHERE id = "
                                   "ANY($1::bigint[]) AND target = $2 AND state = "
                                   "'running' RETURNING id", ids, me)
            if len(got) != len(set(ids)):
                raise _Rollback
    except _Rollback:
        return False
    return True


class _Rollback(Exception):
    """Leaves a transaction without committing what it wrote."""


async def write_marks(conn: asyncpg.Connection, batch: dict[str, list[int]],
                       me: str) -> None:
    for kind in ("started", "done"):  # in the order a turn makes them
        if batch.get(kind):
            await conn.execute(MARKS[kind], batch[kind], me)
