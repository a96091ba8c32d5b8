"""Taking over the work of a dead replica (issue 15 "Replicas"; gateway/cluster/work.py):
rows whose target replica's heartbeat is older than the lease TTL go back to the queue
through the session's lane lease, so the lane's (new) holder runs them; a row whose reply
had begun is marked done instead (reported ``unconfirmed``, never sent twice) and its
reply resolved by the taking replica (``ClusterWork.on_reply_cut``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg

from gateway.cluster import commands, membership
from gateway.turns.work import UserWork

CHANNEL = "tidegate_work"  # NOTIFY payload: the target replica id


async def orphans(conn: asyncpg.Connection, me: str, ttl: float) -> list[Any]:
    """In one transaction: claim up to 500 open rows of dead replicas (SKIP LOCKED), mark
    the replying ones done and requeue the rest for their lane's holder (this replica
    when it takes the lane). Returns the rows handled (not those left where they run)."""
    async with conn.transaction():
        rows = await conn.fetch(
            "SELECT id, session_key, target, started, replying, tools, work, reply FROM "
            "cluster_work w WHERE w.state <> 'done' AND NOT EXISTS (SELECT 1 FROM "
            "cluster_replicas r "
            f"WHERE r.id = w.target AND {membership.alive('$1')}) "
            "ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 500",
            ttl)
        unconfirmed = [r["id"] for r in rows if r["replying"]]
        if unconfirmed:
            await conn.execute("UPDATE cluster_work SET state = 'done', done_at = now() "
                               "WHERE id = ANY($1::bigint[])", unconfirmed)
        by_key: dict[str, list[Any]] = {}
        for r in rows:
            if not r["replying"]:
                by_key.setdefault(r["session_key"], []).append(r)
        kept: set[int] = set()
        for key, group in by_key.items():
            holder = await membership.acquire(conn, "lane:" + key, me, ttl)
            # Its target came back and re-took the lane meanwhile (it woke while this
            # takeover ran): the rows still run there, requeued they would run twice.
            kept.update(r["id"] for r in group if r["target"] == holder)
            ids = [r["id"] for r in group if r["target"] != holder]
            if ids:
                await conn.execute("UPDATE cluster_work SET target = $2, state = "
                                   "'queued', taken_over = true WHERE id = "
                                   "ANY($1::bigint[])", ids, holder)
                await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, holder)
    return [r for r in rows if r["id"] not in kept]



def cut_replies(rows: list[Any]) -> Iterator[tuple[str, UserWork, dict[str, Any], int]]:
    """(session key, work, reply, row id) of each reply that had begun among the taken
    over ``rows``, once per reply (a merged batch shares one: the same ``key``)."""
    seen: set[str] = set()
    for r in rows:
        reply = json.loads(r["reply"]) if r["replying"] and r["reply"] else None
        if not reply or str(reply.get("key") or r["id"]) in seen:
            continue
        seen.add(str(reply.get("key") or r["id"]))
        work = commands.decode(json.loads(r["work"]), str(r["id"]))
        if isinstance(work, UserWork):
            yield r["session_key"], work, reply, r["id"]
