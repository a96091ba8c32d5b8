"""Control API route for a session's timeline verify status (bearer token required):

``GET /api/sessions/{key}/verify`` -> ``{"session_key", "session_id", "status", "events",
"reason", "seq", "detail", "verified_at"}``. ``status`` is ``verified`` (the hash chain of
the session's current timeline recomputes), ``broken`` (``reason``/``seq``/``detail`` name
the first bad event, see ``runtime.timeline.model.VerifyReport``), ``no timeline`` (the
session has recorded nothing yet) or ``disabled`` (the gateway runs without a timeline).
404 for an unknown session. Events queued for the session are committed first, so the
answer covers everything the session did up to the request.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.routing import canonical_key
from gateway.server.control_api import require_token
from gateway.sessions import identity
from runtime.clock import utc_iso
from runtime.timeline import TimelineNotFoundError


async def verify_session(gw: Any, key: str) -> dict[str, Any] | None:
    """The verify status of the session under ``key`` (module docstring), None when no
    agent has that session."""
    found = await identity.find(gw.agents, key)  # replicas: the shared store
    if found is None:
        return None
    entry = found[1]
    out: dict[str, Any] = {"session_key": key, "session_id": entry.session_id, "events": 0,
                           "reason": None, "seq": None, "detail": None,
                           "verified_at": utc_iso(gw.clock.time())}
    hooks = gw.timeline_hooks
    if hooks is None:
        return {**out, "status": "disabled"}
    await hooks.settled(entry.session_id)
    try:
        report = await hooks.timeline.verify(entry.session_id)
    except TimelineNotFoundError:
        return {**out, "status": "no timeline"}
    return {**out, "status": "verified" if report.ok else "broken",
            "events": report.events_checked, "reason": report.reason, "seq": report.seq,
            "detail": report.detail}


def timeline_routes(gw: Any) -> list[web.RouteDef]:
    async def verify(request: web.Request) -> web.Response:
        """The session's timeline verify status (``verified``, ``broken``, ``no timeline``,
        ``disabled``) after its queued events are committed."""
        key = canonical_key(request.match_info["key"])
        out = await verify_session(gw, key)
        if out is None:
            return web.json_response({"ok": False, "error": f"no session {key!r}"},
                                     status=404)
        return web.json_response(out)

    return [web.get("/api/sessions/{key}/verify", require_token(gw, verify))]
