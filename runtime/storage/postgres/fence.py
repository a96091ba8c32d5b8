"""Fenced writes (issue 15 "Replicas"; gateway/cluster/fencing.py): a write that carries
a lease's fencing token — ``(lease name, holder replica, generation)`` — is done only
while the lease row ``cluster_leases`` still names that holder with that generation
(``migrations/0101_lease_fencing.sql``). The check locks the lease row FOR SHARE in the
writing statement or transaction (the lease row locked FOR SHARE where one row is
checked, so a takeover waits for the write; unlocked in many-session batches, see
:func:`holds`).

Used by the timeline (``timeline.py``) and the session store (``sessions.py``) for the
writes of a session whose lane runs under a lease; the cluster's own rows use
:func:`holds` too.
"""

from __future__ import annotations

import asyncpg

from runtime.timeline.model import TimelineFencedError

__all__ = ["Fence", "TimelineFencedError", "holds", "still_held"]

Fence = tuple[str, str, int]  # (lease name, replica id, generation)


def holds(name_sql: str, replica: str, generation: str, *, lock: bool = True) -> str:
    """SQL: the lease named by ``name_sql`` is held by ``replica`` with ``generation``
    (parameters or expressions), locked FOR SHARE so a takeover waits for the write.

    ``lock=False`` for the many-session batches (timeline group commit, transcript lines,
    session rows): locking the lease rows of many sessions in one statement, in no set
    order, deadlocks against lane takeovers that take several leases in one transaction.
    Unlocked, the check is as of the statement's snapshot: a write whose statement began
    before a takeover committed may still land, ordered before anything the new owner
    writes (its head or row waits for it); every later one is refused."""
    share = " FOR SHARE" if lock else ""
    return (f"EXISTS (SELECT 1 FROM cluster_leases fl WHERE fl.name = {name_sql} AND "
            f"fl.replica_id = {replica} AND fl.generation = {generation}{share})")


async def still_held(conn: asyncpg.Connection, fence: Fence) -> bool:
    """Inside the caller's transaction: the lease still matches ``fence`` (the row stays
    locked FOR SHARE until that transaction ends)."""
    return bool(await conn.fetchval(f"SELECT {holds('$1', '$2', '$3::bigint')}", *fence))

