"""Control API route for deleting memory entries through the running gateway (bearer
token required), so ``tidegate memory forget`` never opens the timeline for writing
while the gateway owns it (runtime/timeline/writer.py ``writer_lock``):

``POST /api/memory/forget`` ``{"agent", "scopes": ["user:<id>" | "group:<id>", ...],
"ids": [entry id, ...] | null (all)}`` -> ``{"deleted": [entry id, ...]}``; 400 for a
malformed scope or an unknown agent. The deletion and its ``MEMORY_FORGET`` event (``"by": "cli"``)
are gateway/memory/forget.py's.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.server.control_api import require_token


def memory_routes(gw: Any) -> list[web.RouteDef]:
    async def forget_entries(request: web.Request) -> web.Response:
        """Delete a scope's entries (all, or the given ids) as the operator."""
        from gateway.memory.forget import forget_scopes
        try:
            body = await request.json()
            agent, scopes, ids = str(body["agent"]), body["scopes"], body.get("ids")
            if agent not in gw.config.agent_ids():
                raise ValueError(f"unknown agent {agent!r}")
            if not (isinstance(scopes, list) and scopes and
                    all(isinstance(s, str) for s in scopes)):
                raise ValueError("scopes: a list of user:<id> / group:<id> scopes")
            if ids is not None and not (isinstance(ids, list) and
                                        all(isinstance(i, str) for i in ids)):
                raise ValueError("ids: a list of entry ids, or null for all")
            hooks = gw.timeline_hooks
            gone = await forget_scopes(gw.memory, hooks.timeline if hooks else None, agent,
                                       scopes, ids, {"by": "cli"})
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"ok": False, "error": str(exc)}, status=400)
        return web.json_response({"deleted": [e.entry_id for e in gone]})

    return [web.post("/api/memory/forget", require_token(gw, forget_entries))]
