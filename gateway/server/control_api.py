"""The loopback control API (aiohttp): health, readiness, status, and what the CLI needs.

Every route except ``GET /healthz`` and ``GET /readyz`` requires ``Authorization: Bearer <gateway token>``
(constant-time compare). Routes:

- ``GET /healthz`` -> 200 ``{"ok": true, "status": "live", "instance"}`` (liveness, no
  auth; ``instance`` is a hash of the state dir so a CLI can tell a foreign gateway)
- ``GET /readyz`` -> 200 ``{"ok": true, "status": "ready"}`` (plus ``"problems"`` after a
  failed config reload: the gateway still serves its previous config) or 503 while starting/stopping,
  or while PostgreSQL is unreachable (``{"status": "degraded: postgres unreachable",
  "problems": [...]}``), or while a channel cannot receive (``{"status": "degraded: telegram cannot receive",
  "unhealthy_channels": [...], "problems": [...]}``, see ``gateway.channels.health``)
- ``GET /status`` -> gateway status (agents, lanes, channels, outbox, problems)
- ``POST /api/agent`` ``{message, session_key?, to?, agent?}`` -> ``{session_key,
  session_id, reply, run_id, status}`` (runs one turn through the lanes)
- ``POST /api/agent/stream`` (same body) -> ``application/x-ndjson``, one JSON object a
  line as the turn runs: ``{"type": "progress", "text"}`` (waiting for the model, a retry
  and its delay, a tool running), ``{"type": "delta", "text"}`` (streamed reply text),
  ``{"type": "round_end"}`` (a model round that called tools ended), ``{"type":
  "attempt"}`` (the run starts; a second one is the turn run again after its replica
  died: its deltas start the text afresh), then ``{"type": "result", ...}`` with the
  fields of ``/api/agent``
- ``GET /api/sessions[?agent=ID]``, ``GET /api/sessions/{key}``
- ``POST /api/sessions/{key}/abort`` ``{all?: bool}`` -> ``{ok, aborted, queued, dropped}``
  (what ``/stop`` does)
- ``GET /api/models`` -> providers, auth profiles, chains (``tidegate models status``)
- ``POST /api/sessions/{key}/reset`` -> ``{session_key, old_session_id, session_id}``
- ``POST /api/sessions/{key}/fork`` ``{at, switch}`` and ``.../rewind`` ``{to}`` ->
  ``{session_key, old_session_id, session_id, reply}`` (400 with the reason when refused)
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.channels.local import LocalRequestError
from gateway.routing import canonical_key
from gateway.sessions import identity
from runtime.lanes import LaneClosed
from runtime.turn import TurnResult

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bearer_ok(request: web.Request, token: str, *, allow_query: bool = False) -> bool:
    """True when the request carries the gateway token in ``Authorization: Bearer``, or —
    only where ``allow_query`` (the webchat WebSocket: browsers cannot set headers on it)
    — in ``?token=``."""
    header = request.headers.get("Authorization", "")
    given = header[7:].strip() if header.lower().startswith("bearer ") else ""
    if not given and allow_query:
        given = request.query.get("token", "")
    return bool(given) and hmac.compare_digest(given.encode(), token.encode())


def require_token(gw: Any, handler: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        if not bearer_ok(request, gw.token):
            return web.json_response({"ok": False, "error": "unauthorized"}, status=401,
                                     headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)
    return wrapped


def result_json(result: Any, session_key: str) -> dict[str, Any]:
    if isinstance(result, TurnResult):
        return {"session_key": result.session_key, "session_id": result.session_id,
                "reply": result.text, "run_id": result.run_id, "status": result.status,
                "error": result.error}
    return {"session_key": session_key, "session_id": None, "reply": "(interrupted)",
            "run_id": None, "status": "aborted", "error": getattr(result, "reason", None)}


def _progress(ev: Any, model: str, put: Callable[[dict[str, Any]], None]) -> None:
    """One runtime event of a streamed ``/api/agent`` run as an NDJSON line (or none)."""
    d = ev.data
    if ev.type == "message_update" and d.get("delta"):
        put({"type": "delta", "text": d["delta"]})
    elif ev.type == "message_start":
        put({"type": "progress", "text": f"waiting for {model}…"})
    elif ev.type == "model_error" and d.get("retry_in_s") is not None:
        put({"type": "progress", "text": f"waiting for {d.get('model')}… retry "
                                         f"{d.get('attempt')}/{d.get('of')} in "
                                         f"{d.get('retry_in_s'):.2g} s ({d.get('error')})"})
    elif ev.type == "model_error":
        put({"type": "progress", "text": f"{d.get('model')} failed: {d.get('error')}"})
    elif ev.type == "tool_execution_start":
        put({"type": "progress", "text": f"running tool {d.get('tool')}…"})
    elif ev.type == "message_end" and d.get("tool_calls"):
        put({"type": "round_end"})
    elif ev.type == "agent_start":
        put({"type": "attempt"})


class ControlHandlers:
    """The control API's handlers (module docstring) over one gateway ``gw``."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.instance = gw.loaded.instance_id

    async def healthz(self, _: web.Request) -> web.Response:
        """Liveness: ``{ok, status: live, instance}`` (no token; ``instance`` hashes the state
        dir)."""
        return web.json_response({"ok": True, "status": "live", "instance": self.instance})

    async def readyz(self, _: web.Request) -> web.Response:
        """Readiness: 200 when serving; 503 while starting, stopping, while PostgreSQL is
        unreachable or while a chat channel cannot receive."""
        gw = self.gw
        reload = gw.reload_report.problems()  # serving the previous config is still ready
        if gw.ready and not gw.stopping and not gw.channel_health.unhealthy() and not (
                gw.cluster is not None and gw.cluster.problems()):
            return web.json_response({"ok": True, "status": "ready",
                                      **({"problems": reload} if reload else {})})
        if not (gw.ready and not gw.stopping):
            state = "stopping" if gw.stopping else "starting"
            return web.json_response({"ok": False, "status": state}, status=503)
        if cluster_down := (gw.cluster.problems() if gw.cluster is not None else []):
            return web.json_response({"ok": False, "status": "degraded: postgres unreachable",
                                      "problems": cluster_down}, status=503)
        deaf = gw.channel_health.unhealthy()
        return web.json_response({"ok": False, "unhealthy_channels": deaf,
                                  "status": f"degraded: {', '.join(deaf)} cannot receive",
                                  "problems": [*reload, *(p for p in gw.problems
                                                          if p.startswith("channel "))]},
                                 status=503)

    async def status(self, _: web.Request) -> web.Response:
        """Gateway status: agents, lanes, channels, outbox, unconfirmed deliveries, problems."""
        return web.json_response(self.gw.status())

    async def submit(self, request: web.Request, stream: bool = False) -> Any:
        """The request's turn submitted, or the error response to return. ``stream``: the
        caller shows the reply's text deltas (the model is called streaming)."""
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"ok": False, "error": "body must be JSON"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"ok": False, "error": "body must be an object"},
                                     status=400)
        try:
            return self.gw.local.submit(body.get("message", ""), agent_id=body.get("agent"),
                                   session_key=body.get("session_key"), to=body.get("to"),
                                   channel=body.get("channel") or "cli", stream=stream)
        except LocalRequestError as exc:
            return web.json_response({"ok": False, "error": str(exc)}, status=400)
        except LaneClosed:
            return web.json_response({"ok": False, "error": "shutting down"}, status=503)

    async def agent(self, request: web.Request) -> web.Response:
        """Run one turn: ``{message, session_key?, to?, agent?}`` -> ``{session_key, session_id,
        reply, run_id, status}``."""
        sub = await self.submit(request)
        if isinstance(sub, web.Response):
            return sub
        result = await sub.future
        return web.json_response({"ok": True, **result_json(result, sub.session_key)})

    async def agent_stream(self, request: web.Request) -> web.StreamResponse:
        """Run one turn, streamed as NDJSON lines ``progress``, ``delta``, ``round_end``, then
        ``result``."""
        sub = await self.submit(request, stream=True)
        if isinstance(sub, web.Response):
            return sub
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        lines: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        model = self.gw.agents[sub.agent_id].settings.model_primary or "echo/diagnostic"
        # Subscribed before any await: the turn starts at once and no event is missed.
        unsubscribe = self.gw.bus.subscribe(lambda ev: _progress(ev, model, lines.put_nowait),
                                       run_id=sub.run_id)
        sub.future.add_done_callback(lambda _: lines.put_nowait(None))
        try:
            await resp.prepare(request)
            while (line := await lines.get()) is not None:
                await resp.write(json.dumps(line).encode() + b"\n")
        finally:
            unsubscribe()
        result = sub.future.result()
        await resp.write(json.dumps({"type": "result", "ok": True,
                                     **result_json(result, sub.session_key)}).encode() + b"\n")
        await resp.write_eof()
        return resp

    async def sessions(self, request: web.Request) -> web.Response:
        """Sessions of every agent (``?agent=ID`` for one), most recently active first."""
        only = request.query.get("agent")
        rows = [dict(e.to_json()) for a in self.gw.agents.values() if not only or a.id == only
                for e in await identity.entries(a.store)]  # replicas: the shared store
        return web.json_response(sorted(rows, key=lambda r: r["updated_at"], reverse=True))

    async def session(self, request: web.Request) -> web.Response:
        """One session: ids, times, counters, last route."""
        key = canonical_key(request.match_info["key"])
        found = await identity.find(self.gw.agents, key)  # replicas: the shared store
        if found is not None:
            a, entry = found
            where = self.gw.logs.transcripts.location(a.id, entry.session_id)
            return web.json_response({**entry.to_json(), "transcript": where})
        return web.json_response({"ok": False, "error": f"no session {key!r}"}, status=404)

    async def session_messages(self, request: web.Request) -> web.Response:
        """A session's recent transcript messages (the control UI's transcript viewer)."""
        from gateway.sessions.history import session_history
        key = canonical_key(request.match_info["key"])  # off the loop: PostgreSQL reads block
        return web.json_response(await asyncio.to_thread(session_history, self.gw, key))

    async def mcp(self, _: web.Request) -> web.Response:
        """MCP servers: state, last error, exposed tools."""
        return web.json_response(self.gw.mcp.status())

    async def abort(self, request: web.Request) -> web.Response:
        """Stop the session's running turn, like ``/stop`` (``{all: true}`` also drops queued
        messages)."""
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            return web.json_response({"ok": False, "error": "body must be JSON"}, status=400)
        key = canonical_key(request.match_info["key"])
        drop = bool(body.get("all")) if isinstance(body, dict) else False
        return web.json_response({"ok": True, "session_key": key,
                                  **self.gw.local.lanes.abort(key, drop_queued=drop)})

    async def models(self, _: web.Request) -> web.Response:
        """Providers, auth profiles (state, cooldown, last error class), fallbacks and the model
        each agent would use now."""
        return web.json_response(self.gw.models_status())

    async def models_reset(self, request: web.Request) -> web.Response:
        """``POST /api/models/reset {"profile": name}`` -> ``{"ok", "reset": [...]}``."""
        body = await request.json() if request.can_read_body else {}
        name = str((body or {}).get("profile") or "").strip()
        try:
            done = self.gw.auth_profiles.reset(name)
        except LookupError as exc:
            return web.json_response({"ok": False, "error": str(exc).strip("'\"")},
                                     status=404)
        return web.json_response({"ok": True, "reset": done})

    async def session_reset(self, request: web.Request) -> web.Response:
        """The session's ``/reset`` on its lane (after a running turn): a fresh session id
        under the same key; the old transcript stays on disk."""
        key = canonical_key(request.match_info["key"])
        found = await identity.find(self.gw.agents, key)  # replicas: the shared store
        if found is None:
            return web.json_response({"ok": False, "error": f"no session {key}"}, status=404)
        agent, old = found[0], found[1].session_id
        from gateway.turns.work import CommandWork
        result = await self.gw.local.lanes.submit(key, CommandWork(  # on the lane's holder
            agent_id=agent.id, command="reset", channel="cli"), mergeable=False)
        entry = agent.store.get(key)  # replicas: the result is the lane holder's
        return web.json_response({"ok": True, "session_key": key, "old_session_id": old,
                                  "session_id": getattr(result, "session_id", None) or
                                  (entry.session_id if entry else None),
                                  "reply": getattr(result, "text", "")})


    async def session_fork(self, request: web.Request) -> web.Response:
        """``{at, switch}`` -> ``{session_key (the new one), session_id, reply}``; on the
        session's lane (gateway/sessions/fork.py). ``at``: ``turn:N`` or ``id:X`` (a plain
        N or X is read as the CLI reads it)."""
        return await self._fork(request, "fork")

    async def session_rewind(self, request: web.Request) -> web.Response:
        """``{to}`` -> ``{session_key, session_id (the new one), reply}``."""
        return await self._fork(request, "rewind")

    async def _fork(self, request: web.Request, command: str) -> web.Response:
        key = canonical_key(request.match_info["key"])
        found = await identity.find(self.gw.agents, key)  # replicas: the shared store
        if found is None:
            return web.json_response({"ok": False, "error": f"no session {key}"}, status=404)
        agent, old = found[0], found[1].session_id
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return web.json_response({"ok": False, "error": "expected a JSON object"},
                                     status=400)
        at = str(body.get("to" if command == "rewind" else "at", "")).strip()
        args = at + ("" if command == "rewind" or body.get("switch") else " --new-key")
        from gateway.turns.work import CommandWork
        result = await self.gw.local.lanes.submit(key, CommandWork(
            agent_id=agent.id, command=command, channel="cli", args=args), mergeable=False)
        reply = getattr(result, "text", "")
        new_id = getattr(result, "session_id", None)
        if not new_id or new_id == old:
            return web.json_response({"ok": False, "error": reply}, status=400)
        entry = agent.store.by_session_id(new_id)
        return web.json_response({"ok": True, "old_session_id": old, "session_id": new_id,
                                  "session_key": entry.session_key if entry else key,
                                  "reply": reply})


def control_routes(gw: Any) -> list[web.RouteDef]:
    h = ControlHandlers(gw)
    t = lambda handler: require_token(gw, handler)
    return [
        web.get("/healthz", h.healthz),
        web.get("/readyz", h.readyz),
        web.get("/status", t(h.status)),
        web.post("/api/agent", t(h.agent)),
        web.post("/api/agent/stream", t(h.agent_stream)),
        web.get("/api/sessions", t(h.sessions)),
        web.get("/api/sessions/{key}", t(h.session)),
        web.get("/api/mcp", t(h.mcp)),
        web.post("/api/sessions/{key}/abort", t(h.abort)),
        web.get("/api/models", t(h.models)),
        web.post("/api/models/reset", t(h.models_reset)),
        web.post("/api/sessions/{key}/reset", t(h.session_reset)),
        web.post("/api/sessions/{key}/fork", t(h.session_fork)),
        web.post("/api/sessions/{key}/rewind", t(h.session_rewind)),
        web.get("/api/sessions/{key}/messages", t(h.session_messages)),
    ]
