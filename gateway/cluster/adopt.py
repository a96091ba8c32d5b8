"""A session's order across a takeover: when a message routes a lane (``ClusterWork._assign``),
the session's older unfinished rows left by a dead replica go first.

Without this, a message received after the owner died (the account's new owner polls it)
took the dead replica's lane and ran at once, while the interrupted turn before it was
taken over a moment later and queued behind it. Re-run after the newer message was
already in the transcript, the old turn answered the newer message a second time and
its own message never got a reply (``[m0, m2, m2]``).

So in the routing transaction, before the lane lease is taken, the session's open rows
whose replica is dead are locked (oldest first) and moved to the lane's holder with the
same outcome rules as :func:`gateway.cluster.takeover.orphans`: a row whose reply had
begun is marked done (its reply is resolved, never sent twice); the others are queued
for the holder, or marked running here when this replica is the holder and returned, to
be started before the new rows. Older rows already queued for this replica (a takeover
tick requeued them here a moment before, and no claim has run them yet) are started
first the same way: without that, a message routed in between ran before them. Rows are locked before the lease, as the takeover locks
them, so the two never wait for each other in a cycle.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from gateway.cluster import crashes, membership


@dataclass(slots=True)
class Assigned:
    """What routing rows to a lane did: its ``holder``; ``adopted``, a dead replica's
    older rows of the session now running here (oldest first, to start before the new
    rows); ``dead``, every such row handed over (those replying are done now)."""

    holder: str
    adopted: list[Any]
    dead: list[Any]
    dead_letters: list[Any] = field(default_factory=list)  # (row, crashes): set aside


COLUMNS = ("id, session_key, target, started, replying, tools, taint, work, reply, "
           "taken_over, "
           + crashes.COLUMNS)


async def lock_dead_rows(conn: asyncpg.Connection, key: str, before: int, me: str,
                         ttl: float, *, wait: bool = True) -> list[Any]:
    """Inside the caller's transaction: lock the open rows of session ``key`` with an id
    below ``before`` whose target replica is dead (heartbeat older than ``ttl`` seconds)
    or unset, oldest first. ``wait=False`` skips rows another transaction holds."""
    skip = "" if wait else " SKIP LOCKED"
    return list(await conn.fetch(
        f"SELECT {COLUMNS} FROM cluster_work w WHERE w.session_key = $1 AND w.id < $2 AND "
        "w.state <> 'done' AND w.target IS DISTINCT FROM $3 AND NOT EXISTS (SELECT 1 FROM "
        f"cluster_replicas r WHERE r.id = w.target AND {membership.alive('$4')}) "
        f"ORDER BY w.id FOR UPDATE{skip}", key, before, me, ttl))


async def set_aside(conn: asyncpg.Connection, rows: list[Any]
                    ) -> tuple[list[Any], list[Any]]:
    """Count the crash of the locked dead ``rows`` (gateway/cluster/crashes.py): returns
    ``(dead letters as (row, crashes), the other rows)``."""
    letters, ids = await crashes.account(conn, rows)
    return letters, [r for r in rows if r["id"] not in ids]


def resume_order(rows: list[Any]) -> list[Any]:
    """``rows`` in the order a session's taken-over rows run, as a restart resumes them on
    one host (gateway/journal/resume.py): the turns that had started first, then the
    others, each oldest first. A dead replica's lane may have started a younger row before
    an older one (accepted in one order, routed in the other); run first, the older one
    would answer the younger row's message too, already in the transcript."""
    return sorted(rows, key=lambda r: (not r["started"], r["id"]))


def turns(rows: list[Any]) -> list[list[Any]]:
    """``rows`` (in the order they run) grouped by turn: the begun rows of one session
    that share a run id (messages merged into one turn, steered in), and the parts of
    one album, form one group at the place of the first; every other row is a group of
    its own."""
    groups: list[list[Any]] = []
    by_turn: dict[tuple[str, ...], list[Any]] = {}
    for r in rows:
        run = r.get("run_id") if r["started"] else None
        album = _album(r["work"])
        if not run and not album:
            groups.append([r])
            continue
        key = (str(r["session_key"]), "album", album) if album else \
            (str(r["session_key"]), "run", str(run))
        if key in by_turn:
            by_turn[key].append(r)
        else:
            by_turn[key] = [r]
            groups.append(by_turn[key])
    return groups


def _album(raw: Any) -> str:
    """The album key of a row's work (JSON text or a dict), "" when it is none's part."""
    try:
        work = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
    except (TypeError, ValueError):
        return ""
    return str(work.get("album") or "") if isinstance(work, dict) else ""


async def lock_queued_rows(conn: asyncpg.Connection, key: str, before: int,
                           me: str) -> list[Any]:
    """Inside the caller's transaction: lock the queued rows of session ``key`` with an id
    below ``before`` already targeted at this replica (a takeover queued them here, or a
    replica forwarded them, and :meth:`ClusterWork.claim` has not run them yet), oldest
    first; rows a claim holds are skipped (that claim starts them)."""
    return list(await conn.fetch(
        f"SELECT {COLUMNS} FROM cluster_work WHERE session_key = $1 AND id < $2 AND "
        "target = $3 AND state = 'queued' ORDER BY id FOR UPDATE SKIP LOCKED",
        key, before, me))


async def hand_over(conn: asyncpg.Connection, rows: list[Any], holder: str,
                    me: str) -> list[Any]:
    """Move the locked ``rows`` to the lane's ``holder``: replying rows done, the rest
    queued for it (``running`` when ``holder`` is ``me``). Returns the rows that run
    here now, oldest first (empty when another replica holds the lane)."""
    if not rows:
        return []
    cut = [r["id"] for r in rows if r["replying"]]
    rest = [r["id"] for r in rows if not r["replying"]]
    if cut:
        await conn.execute("UPDATE cluster_work SET state = 'done', done_at = now() "
                           "WHERE id = ANY($1::bigint[])", cut)
    if rest:
        await conn.execute("UPDATE cluster_work SET target = $2, state = $3, taken_over = "
                           "true WHERE id = ANY($1::bigint[])", rest, holder,
                           "running" if holder == me else "queued")
    return [r for r in rows if not r["replying"]] if holder == me else []
