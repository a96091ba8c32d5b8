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
import structlog

from gateway.cluster import commands, crashes, membership
from gateway.journal.resume import STREAM_CUT_NOTICE, _reply_outcome
from gateway.turns.work import UserWork

CHANNEL = "tidegate_work"  # NOTIFY payload: the target replica id
log = structlog.get_logger(__name__)


def log_taken_over(rows: list[Any], **why: Any) -> None:
    """One ``cluster_work_taken_over`` record per row taken from a dead replica."""
    for r in rows:
        log.warning("cluster_work_taken_over", session_key=r["session_key"],
                    entry_id=r["id"], previous=r["target"], started=r["started"],
                    action="unconfirmed" if r["replying"] else
                    "continue" if r["tools"] else "run", **why)


async def orphans(conn: asyncpg.Connection, me: str, ttl: float
                  ) -> tuple[list[Any], list[Any]]:
    """In one transaction: claim up to 500 open rows of dead replicas (SKIP LOCKED), count
    the crash of the started ones and set aside those due (gateway/cluster/crashes.py),
    mark the replying ones done and requeue the rest for their lane's holder (this
    replica when it takes the lane). Returns ``(the rows handled, not those left where
    they run nor the dead letters; the dead letters as (row, crashes))``."""
    async with conn.transaction():
        rows = await conn.fetch(
            "SELECT id, session_key, target, started, replying, tools, work, reply, "
            f"{crashes.COLUMNS} FROM "
            "cluster_work w WHERE w.state <> 'done' AND NOT EXISTS (SELECT 1 FROM "
            "cluster_replicas r "
            f"WHERE r.id = w.target AND {membership.alive('$1')}) "
            "ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 500",
            ttl)
        dead, dead_ids = await crashes.account(conn, rows)
        rows = [r for r in rows if r["id"] not in dead_ids]
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
    return [r for r in rows if r["id"] not in kept], dead



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


async def resolve_cut_reply(gw: Any, key: str, work: Any, reply: dict[str, Any],
                            row: int) -> None:
    """A taken-over turn's reply had begun on the dead replica: resolved as after a
    restart on one host (gateway/journal/resume.py ``_resolve_reply``), never posted
    twice: a streamed one gets the cut-off notice, a plain one the platform's
    unknown-outcome resend (Discord nonce, Slack lookup, Telegram unconfirmed); only
    drafts shown (they lapse when the replica dies) posts the finished reply now."""
    outcome, deliverer = "no route", gw.deliverer
    if work.route is not None and reply.get("stream") == "draft" and reply.get("text"):
        sent = await deliverer.send(work.route, str(reply["text"]), session_key=key,
                                    reply_to=work.message_id)
        outcome = "delivered" if sent.ok else "failed"
    elif work.route is not None and reply.get("stream"):
        await deliverer.send(work.route, STREAM_CUT_NOTICE, kind="notice", session_key=key)
        outcome = "stream_cut"
    elif work.route is not None and reply.get("text"):
        outcome = await deliverer.resend_unknown(
            work.route, str(reply["text"]), since=float(reply.get("ts") or 0),
            session_key=key, idempotency_key=str(reply.get("key") or row),
            reply_to=work.message_id)
    # the message's outcome, as after a restart on one host (a cut stream left the
    # message with neither a reply nor a recorded outcome)
    gw.outcomes.record([work], *_reply_outcome(outcome), session_key=key)
    (log.warning if outcome == "unconfirmed" else log.info)(
        "cluster_reply_resolved", session_key=key, entry_id=row, delivery=outcome,
        channel=work.channel, message_id=work.message_id)


ENDED = ("SELECT EXISTS (SELECT 1 FROM timeline_events e JOIN timelines t ON t.session_id = "
         "e.session_id WHERE t.session_key = $1 AND e.event_type = 'OUTCOME' AND "
         "e.content::jsonb ->> 'entry_id' = $2)")


async def already_ended(conn: asyncpg.Connection, session_key: str, row_id: int) -> bool:
    """Whether the message of work row ``row_id`` has its outcome already (an ``OUTCOME``
    event of its session names the row): its turn ended, and only the row's batched done
    mark was lost with the process. Run again, it would end a second time."""
    return bool(await conn.fetchval(ENDED, session_key, str(row_id)))


async def recorded(work: Any, session_key: str, row_id: int) -> bool:
    """Whether the message of row ``row_id`` of ``work`` (ClusterWork) has its outcome:
    in this replica's journal, else in the shared timeline. PostgreSQL unreachable:
    False (a second outcome beats none)."""
    from gateway.cluster.db import ClusterUnavailable
    if work.outcome_known is not None and work.outcome_known(str(row_id)):
        return True
    try:
        return bool(await work.db.run(lambda c: already_ended(c, session_key, row_id)))
    except ClusterUnavailable:
        return False


async def ended(work: Any, r: Any) -> bool:
    """Whether the taken-over row ``r`` of ``work`` (ClusterWork) already has its outcome
    (:func:`recorded`): then it is marked done and not run a second time."""
    known = await recorded(work, r["session_key"], r["id"])
    if known:
        work.finished_rows([r["id"]])
        log.info("cluster_work_already_ended", session_key=r["session_key"],
                 entry_id=r["id"])
    return known


async def resolve_once(work: Any, cut: tuple[str, UserWork, dict[str, Any], int]) -> None:
    """Resolve one reply cut by a takeover (``cut``: from :func:`cut_replies`) with
    ``work.on_reply_cut``, unless its message has its outcome already: the reply was
    sent and the outcome recorded, only the row's batched done mark was lost with the
    process. Resolved, it would get a second outcome (and a cut-off notice or a resend
    after a reply that arrived)."""
    key, _work, _reply, row = cut
    if await recorded(work, key, row):
        log.info("cluster_reply_already_ended", session_key=key, entry_id=row)
        return
    await work.on_reply_cut(*cut)
