"""Control API routes of outcomes and dead letters (bearer token required;
docs/outcomes.md):

- ``GET /api/outcomes?session_key=&since=&limit=`` -> ``{"outcomes": [row, ...],
  "unresolved": n, "counts": {outcome: n}}``; rows oldest first (``since``: epoch s).
- ``GET /api/dead-letters`` -> ``{"dead_letters": [row + "crashes" + "text", ...]}``
- ``GET /api/dead-letters/{id}`` -> the dead letter with its whole message (404 unknown)
- ``POST /api/dead-letters/{id}/resubmit`` -> ``{"ok", "id", "new_entry_id"}``
- ``DELETE /api/dead-letters/{id}`` -> ``{"ok", "id"}``
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.journal import dead_letters
from gateway.journal.recorder import outcome_status
from gateway.routing import canonical_key
from gateway.server.control_api import require_token


async def _cluster_rows(gw: Any, key: str | None, since: float | None,
                        limit: int | None) -> list[dict[str, Any]] | None:
    """Replicas: the outcome rows of every replica, from the shared timeline; None on one
    host or while PostgreSQL is unreachable (this replica's own rows answer then)."""
    if gw.cluster is None:
        return None
    from gateway.cluster.db import ClusterUnavailable
    from gateway.cluster.shared_outcomes import select
    try:
        return await select(gw.cluster.db, key, since, limit)
    except ClusterUnavailable:
        return None


def merged(shared: list[dict[str, Any]] | None, own: list[dict[str, Any]],
           limit: int | None) -> list[dict[str, Any]]:
    """The shared rows plus this replica's own rows (its journal) that they lack, oldest
    first, the newest ``limit``. An outcome is in the journal at once, its ``OUTCOME``
    event a moment later: a replica killed in between lost the event, not the row (a
    local caller already had its answer), so its own rows complete the list."""
    if shared is None:
        return own
    seen = {str(r.get("id")) for r in shared}
    rows = sorted([*shared, *(r for r in own if str(r.get("id")) not in seen)],
                  key=lambda r: float(r.get("ts") or 0))
    return rows[-limit:] if limit else rows


def outcome_routes(gw: Any) -> list[web.RouteDef]:
    def bad(status: int, error: str) -> web.Response:
        return web.json_response({"ok": False, "error": error}, status=status)

    async def outcomes(request: web.Request) -> web.Response:
        q = request.query
        try:
            since = float(q["since"]) if q.get("since") else None
            limit = int(q["limit"]) if q.get("limit") else None
        except ValueError:
            return bad(400, "since: epoch seconds; limit: an integer")
        key = canonical_key(q["session_key"]) if q.get("session_key") else None
        rows = merged(await _cluster_rows(gw, key, since, limit),
                      gw.journal.outcomes.select(key, since, limit), limit)
        return web.json_response({"outcomes": rows, **outcome_status(gw)})

    async def listing(_: web.Request) -> web.Response:
        return web.json_response({"dead_letters": dead_letters.listing(gw.journal)})

    async def show(request: web.Request) -> web.Response:
        found = dead_letters.find(gw.journal, request.match_info["id"])
        return web.json_response(found) if found else bad(404, "no such dead letter")

    async def resubmit(request: web.Request) -> web.Response:
        found = dead_letters.find(gw.journal, request.match_info["id"])
        eid = str(found["id"]) if found else request.match_info["id"]  # a prefix: the id
        try:
            new = await dead_letters.resubmit(gw, eid)
        except (TypeError, ValueError) as exc:
            return bad(400, f"the message cannot be read back: {exc}")
        return web.json_response({"ok": True, "id": eid, "new_entry_id": new}) if new \
            else bad(404, "no such dead letter")

    async def drop(request: web.Request) -> web.Response:
        found = dead_letters.find(gw.journal, request.match_info["id"])
        eid = str(found["id"]) if found else request.match_info["id"]  # a prefix: the id
        return web.json_response({"ok": True, "id": eid}) \
            if dead_letters.drop(gw, eid) else bad(404, "no such dead letter")

    t = lambda handler: require_token(gw, handler)
    return [web.get("/api/outcomes", t(outcomes)),
            web.get("/api/dead-letters", t(listing)),
            web.get("/api/dead-letters/{id}", t(show)),
            web.post("/api/dead-letters/{id}/resubmit", t(resubmit)),
            web.delete("/api/dead-letters/{id}", t(drop))]
