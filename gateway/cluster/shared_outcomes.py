"""``tidegate sessions outcomes`` on replicas (README "Replicas": reads answer from the
shared store): every replica records each message's one outcome as an ``OUTCOME`` event
of its session's timeline in PostgreSQL (at once on replicas, not with the session's
next write), so any replica lists the outcomes of messages that ran anywhere. Rows have
the shape of the intake journal's (gateway/journal/outcomes.py ``ROW_FIELDS``;
``accepted_at`` is None: the timeline does not keep it).

A message has one outcome: the first recorded wins (gateway/journal/recorder.py). The
timeline is append-only, so a second ``OUTCOME`` event naming the same entry (a takeover
that re-ran a message while PostgreSQL could not tell it had ended) stays there; the
listing keeps the first per entry id and leaves the later ones out.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from gateway.routing import agent_of_key

SELECT = (
    "SELECT e.event_id, e.\"timestamp\", e.content, t.session_key FROM timeline_events e "
    "JOIN timelines t ON t.session_id = e.session_id WHERE e.event_type = 'OUTCOME' "
    "AND ($1::text IS NULL OR t.session_key = $1) "
    "AND ($2::bigint IS NULL OR e.\"timestamp\" >= $2) "
    "ORDER BY e.\"timestamp\" DESC, e.event_id LIMIT $3")
MAX_ROWS = 10_000  # as the journal keeps (gateway/journal/outcomes.py KEPT)


async def select(db: Any, session_key: str | None, since: float | None,
                 limit: int | None) -> list[dict[str, Any]]:
    """Outcome rows oldest first: of ``session_key`` only and recorded at or after
    ``since`` (epoch s) when given; the newest ``limit`` (at most :data:`MAX_ROWS`).
    Raises ClusterUnavailable when PostgreSQL cannot be reached."""
    since_ms = int(since * 1000) if since is not None else None
    n = min(limit or MAX_ROWS, MAX_ROWS)

    async def fetch(conn: asyncpg.Connection) -> list[Any]:
        return await conn.fetch(SELECT, session_key, since_ms, n)
    return first_per_entry([_row(r) for r in reversed(await db.run(fetch))])


def first_per_entry(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (oldest first) without the later rows of an entry id already listed."""
    seen: set[str] = set()
    out = []
    for row in rows:
        if row["id"] not in seen:
            seen.add(row["id"])
            out.append(row)
    return out


def _row(r: Any) -> dict[str, Any]:
    try:
        content = json.loads(r["content"])
    except ValueError:
        content = {}
    key = r["session_key"]
    try:
        agent = agent_of_key(key)
    except ValueError:
        agent = None
    entry = content.get("entry_id")
    return {"id": str(entry or r["event_id"]), "ts": r["timestamp"] / 1000,
            "outcome": content.get("outcome"), "detail": content.get("detail") or "",
            "session_key": key, "accepted_at": None, "channel": content.get("channel"),
            "message_id": content.get("message_id"), "agent": agent,
            **({"local": True} if entry is None else {})}
