"""Control API routes of the approvals (bearer token required; docs/exec.md):

- ``GET /api/approvals`` -> ``{"pending": [request...], "recent": [request...],
  "always": {agent: [{pattern, by, at}]}}`` (requests as ``ApprovalRequest.to_dict()``,
  recent = the newest 50 decided ones; on replicas every replica's requests). Each
  request also has ``shown``: its command, session key, reason, binary and decider with
  every invisible or blank-looking character escaped, as the chat prompts show them
  (gateway/approvals/prompts.py ``shown_fields``), and ``escaped`` (bool) — what the
  control UI displays; each ``always`` entry has ``shown`` too (``{pattern, by, escaped}``,
  escaped the same way)
- ``POST /api/approvals/{id}/allow`` ``{"always": bool?}`` and
  ``POST /api/approvals/{id}/deny`` -> ``{"ok": true, "approval": request}``; 404 for an
  unknown id, 409 when it is already decided (or "always" for a command that is not
  plain). The decision is recorded as by ``operator:api`` (``operator:cli`` when the CLI
  says so with ``{"by": "cli"}``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.approvals.prompts import pattern_shown, shown_fields
from gateway.server.control_api import require_token


def approvals_routes(gw: Any) -> list[web.RouteDef]:
    async def listing(request: web.Request) -> web.Response:
        listing = await gw.approvals.records.listing()
        for r in [*listing["pending"], *listing["recent"]]:
            r["shown"] = shown_fields(r)
        listing["always"] = {agent: [{**p, "shown": pattern_shown(p)} for p in patterns]
                             for agent, patterns in listing["always"].items()}
        return web.json_response(listing)

    async def decide(request: web.Request) -> web.Response:
        rid, verb = request.match_info["id"], request.match_info["verb"]
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            return web.json_response({"ok": False, "error": "body must be JSON"}, status=400)
        body = body if isinstance(body, dict) else {}
        choice = "deny" if verb == "deny" else "always" if body.get("always") else "once"
        by = "operator:cli" if body.get("by") == "cli" else "operator:api"
        try:
            req = await gw.approvals.decide(rid, choice, by)
        except KeyError:
            return web.json_response({"ok": False, "error": f"no approval {rid!r}"},
                                     status=404)
        except ValueError as exc:
            return web.json_response({"ok": False, "error": f"approval {rid}: {exc}"},
                                     status=409)
        return web.json_response({"ok": True, "approval": req.to_dict()})

    return [web.get("/api/approvals", require_token(gw, listing)),
            web.post(r"/api/approvals/{id}/{verb:allow|deny}", require_token(gw, decide))]
