"""Replica heartbeat rows and named leases (issue 15 "Start", "Lanes", "Channel
accounts").

A lease ``name`` (``account:telegram:default``, ``lane:<session key>``) is one row naming
its holder. It is valid while the holder's heartbeat row is younger than the lease TTL,
measured in database time (``now()``), so replicas' clocks never have to agree. Taking a
lease is one statement: insert, or take the row over when its holder is presumed dead.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import asyncpg

from runtime.storage.postgres.fence import holds

__all__ = ["acquire", "acquire_fenced", "alive", "beat", "holds", "leave", "live_replicas",
           "rejoin", "release", "snapshot"]


def alive(ttl_param: str) -> str:
    """SQL: replica row ``r`` is alive (heartbeat younger than the TTL parameter)."""
    return (f"r.heartbeat_at > now() - make_interval(secs => {ttl_param}) "
            f"AND r.stopped_at IS NULL")


def default_replica_id(configured: str | None) -> str:
    """``cluster.replica_id``, else ``$TIDEGATE_REPLICA_ID``, else ``<host>-<pid>``."""
    return configured or os.environ.get("TIDEGATE_REPLICA_ID") or \
        f"{socket.gethostname()}-{os.getpid()}"


async def beat(conn: asyncpg.Connection, replica: str, port: int | None) -> None:
    """Insert or refresh this replica's heartbeat row."""
    await conn.execute(
        "INSERT INTO cluster_replicas (id, host, pid, port) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), stopped_at = NULL, "
        "pid = EXCLUDED.pid, port = EXCLUDED.port",
        replica, socket.gethostname(), os.getpid(), port)


async def rejoin(conn: asyncpg.Connection, replica: str, port: int | None) -> None:
    """Start of a replica: whatever a previous process with this id left behind (it was
    killed and restarted within the lease TTL, e.g. by systemd) is orphaned at once, so
    the usual takeover runs it: leases go, unfinished work and cron runs lose their
    owner, claimed replies go back to the queue. Then the heartbeat row is written."""
    async with conn.transaction():
        await conn.execute("DELETE FROM cluster_leases WHERE replica_id = $1", replica)
        await conn.execute("UPDATE cluster_work SET target = NULL WHERE target = $1 AND "
                           "state <> 'done'", replica)
        await conn.execute("UPDATE cluster_cron_runs SET replica_id = $1 || ' (previous)' "
                           "WHERE replica_id = $1 AND state = 'running'", replica)
        await conn.execute("UPDATE cluster_outbound SET claimed_by = NULL WHERE "
                           "claimed_by = $1", replica)
        await beat(conn, replica, port)


async def leave(conn: asyncpg.Connection, replica: str) -> None:
    """Clean stop: give every lease back and mark the row stopped. The attempts of this
    replica's open rows (turns the shutdown grace cut off) end here, stopped by the
    operator: each row's current attempt is closed as a takeover closes it
    (gateway/cluster/crashes.py ``attempt_from``/``attempts_seen``) but without a crash
    counted, so the replica that takes them over resumes them uncharged; only a death
    (no ``leave``) counts toward the dead letters."""
    async with conn.transaction():
        await conn.execute("UPDATE cluster_work SET attempt_from = cardinality(tools), "
                           "attempts_seen = attempts WHERE target = $1 AND state <> 'done'",
                           replica)
        await conn.execute("DELETE FROM cluster_leases WHERE replica_id = $1", replica)
        await conn.execute("UPDATE cluster_replicas SET stopped_at = now() WHERE id = $1",
                           replica)


async def acquire(conn: asyncpg.Connection, name: str, replica: str, ttl: float) -> str:
    """Take lease ``name`` if it is free or its holder is dead; returns the holder (this
    replica on success). The row stays locked until the caller's transaction ends."""
    return (await acquire_fenced(conn, name, replica, ttl))[0]


async def acquire_fenced(conn: asyncpg.Connection, name: str, replica: str,
                         ttl: float) -> tuple[str, int]:
    """:func:`acquire` returning ``(holder, generation)``: the generation (the fencing
    token, ``0101_lease_fencing.sql``) is new whenever the lease changes hands and kept
    while the holder re-takes it.

    A re-take renews ``acquired_at``, and a takeover needs the lease row itself to be
    older than the TTL as well as its holder's heartbeat. The row's columns are judged at
    their latest committed version (``ON CONFLICT`` re-reads the row it waited for), the
    heartbeat subquery only as of the statement's snapshot: without the row check, a
    takeover whose snapshot predates the holder's wake-up (its beat, then its re-take,
    committed while the takeover waited for the row) took the lease the holder had just
    re-taken, and both replicas ran the lane."""
    row = await conn.fetchrow(
        "INSERT INTO cluster_leases AS l (name, replica_id) VALUES ($1, $3) "
        "ON CONFLICT (name) DO UPDATE SET replica_id = $3, acquired_at = now(), "
        "generation = CASE WHEN l.replica_id = $3 THEN l.generation "
        "ELSE nextval('cluster_lease_generation') END "
        "WHERE l.replica_id = $3 OR (l.acquired_at <= now() - make_interval(secs => $2) "
        "AND NOT EXISTS (SELECT 1 FROM cluster_replicas r "
        f"WHERE r.id = l.replica_id AND {alive('$2')})) RETURNING replica_id, generation",
        name, ttl, replica)
    if row is not None:
        return row["replica_id"], row["generation"]
    held = await conn.fetchrow("SELECT replica_id, generation FROM cluster_leases "
                               "WHERE name = $1 FOR UPDATE", name)
    if held is None:  # released meanwhile
        return await acquire_fenced(conn, name, replica, ttl)
    return held["replica_id"], held["generation"]


async def release(conn: asyncpg.Connection, name: str, replica: str) -> bool:
    return await conn.fetchval("DELETE FROM cluster_leases WHERE name = $1 AND "
                               "replica_id = $2 RETURNING true", name, replica) or False


async def live_replicas(conn: asyncpg.Connection, ttl: float) -> list[str]:
    rows = await conn.fetch(f"SELECT r.id FROM cluster_replicas r WHERE {alive('$1')} "
                            "ORDER BY r.id", ttl)
    return [r["id"] for r in rows]


async def snapshot(conn: asyncpg.Connection, ttl: float) -> dict[str, Any]:
    """Replicas with their heartbeat age and leases (``status`` on any replica)."""
    replicas = await conn.fetch(
        "SELECT id, host, pid, port, started_at, stopped_at, "
        "extract(epoch FROM now() - heartbeat_at) AS age FROM cluster_replicas "
        "WHERE stopped_at IS NULL OR stopped_at > now() - interval '1 hour' ORDER BY id")
    leases = await conn.fetch("SELECT name, replica_id, "
                              "extract(epoch FROM now() - acquired_at) AS age "
                              "FROM cluster_leases ORDER BY name")
    out: dict[str, Any] = {}
    for r in replicas:
        out[r["id"]] = {"host": r["host"], "pid": r["pid"], "port": r["port"],
                        "lease_age_s": round(float(r["age"]), 1),
                        "alive": r["stopped_at"] is None and float(r["age"]) < ttl,
                        "stopped": r["stopped_at"] is not None,
                        "accounts": [], "lanes": []}
    for lease in leases:
        entry = out.get(lease["replica_id"])
        if entry is None:
            continue
        kind, _, rest = lease["name"].partition(":")
        if kind == "account":
            entry["accounts"].append({"account": rest,
                                      "held_s": round(float(lease["age"]), 1)})
        elif kind == "lane":
            entry["lanes"].append(rest)
    return out
