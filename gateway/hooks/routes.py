"""``POST /hooks/<name>`` (or a hook's own ``path``): one webhook delivery.

In order: an unknown path is 404; a body over ``max_body`` 413; a missing or wrong
signature 401; a body that is not a JSON object or array 400 — each logged as
``hook_refused`` with its reason, and no turn runs. A delivery id seen before (a retry or
a replay, ``gateway/hooks/verify.py``) answers 200 ``{"duplicate": true}`` and runs
nothing. Otherwise the template's text starts a turn in the hook's session (channel
``webhook``: the turn is tainted, docs/exec.md) — 202 ``{session_key, run_id}`` at once,
or with ``wait`` 200 ``{reply, status}`` when it is done (504 after ``timeout``) — or, for
``action: event``, is queued as a system event that wakes the session (202). With
``deliver`` the reply also goes to that channel target, journaled before the 202 like a
chat message (answered after a crash). Hooks are read from the current config, so a
reload adds or changes them without a restart.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import structlog
from aiohttp import web

from gateway.config.hooks import HookConfig, hook_path
from gateway.hooks.template import render
from gateway.hooks.verify import delivery_id, signature_ok
from gateway.routing import Route, canonical_key, main_session_key, normalize_id
from gateway.turns.work import UserWork
from runtime.lanes import LaneClosed

log = structlog.get_logger(__name__)
CHANNEL = "webhook"


def hook_session_key(name: str, hook: HookConfig, agent: str) -> str:
    """The session key a hook's turns run in: ``session`` (``main``: the agent's main
    session), else ``agent:<agent>:hook:<name>``."""
    if hook.session == "main":
        return main_session_key(agent)
    if hook.session:
        return canonical_key(hook.session)
    return f"agent:{agent}:hook:{normalize_id(name)}"


def _refuse(status: int, reason: str, request: web.Request, hook: str | None) -> web.Response:
    log.warning("hook_refused", hook=hook, path=request.path, status=status, reason=reason,
                remote=request.remote)
    return web.json_response({"ok": False, "error": reason}, status=status)


def _find(gw: Any, path: str) -> tuple[str, HookConfig] | None:
    for name, hook in gw.config.hooks.items():
        if hook_path(name, hook) == path.rstrip("/"):
            return name, hook
    return None


async def _read(request: web.Request, limit: int) -> bytes | None:
    """The body, or None when it is longer than ``limit`` bytes."""
    if request.content_length is not None and request.content_length > limit:
        return None
    body = await request.content.read(limit + 1)
    return None if len(body) > limit else body


async def _seen(gw: Any, key: str) -> bool:
    dedupe = gw.intake.dedupe
    return dedupe is not None and not await dedupe.acheck_and_mark(key)


def hook_routes(gw: Any) -> list[web.RouteDef]:
    """The webhook route of the gateway's HTTP server (gateway/server/http.py)."""
    async def receive(request: web.Request) -> web.Response:
        """One webhook delivery (see the module docstring for the answers)."""
        found = _find(gw, request.path)
        if found is None:
            return _refuse(404, "unknown hook", request, None)
        name, hook = found
        body = await _read(request, hook.max_body)
        if body is None:
            return _refuse(413, f"body larger than {hook.max_body} bytes", request, name)
        if not signature_ok(hook.signature, hook.secret, request.headers, body):
            return _refuse(401, "bad signature", request, name)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # nesting deeper than the parser goes
            data = None
        if not isinstance(data, (dict, list)):
            return _refuse(400, "body is not a JSON object or array", request, name)
        return await _run(gw, request, name, hook, body, data)

    return [web.post("/hooks/{tail:.+}", receive)]


async def _run(gw: Any, request: web.Request, name: str, hook: HookConfig, body: bytes,
               data: Any) -> web.Response:
    agent = (hook.agent or gw.config.default_agent()).lower()
    key = hook_session_key(name, hook, agent)
    delivery = delivery_id(hook.signature, request.headers, body)
    event = request.headers.get("X-GitHub-Event") or request.headers.get("X-Event")
    text = render(hook.message_template, data, hook=name, event=event)
    seen_key = f"{CHANNEL}:{name}:{delivery}"
    if gw.lanes.closed:
        return _refuse(503, "the gateway is stopping; retry", request, name)
    if hook.action == "event":
        if await _seen(gw, seen_key):
            return _duplicate(name, delivery)
        # the body came from outside: the turn draining it is tainted, as a webhook
        # turn is (gateway/approvals/service.py sender_taint)
        gw.scheduling.enqueue(key, text, f"webhook:{name}", wake=True,
                              taint=(f"webhook {name} (content from outside the gateway)",))
        log.info("hook_accepted", hook=name, action="event", session_key=key,
                 delivery=delivery)
        return web.json_response({"ok": True, "session_key": key, "queued": "event"},
                                 status=202)
    route = Route.parse_target(hook.deliver) if hook.deliver else None
    work = UserWork(agent_id=agent, text=text or f"(webhook {name}: empty message)",
                    channel=CHANNEL, sender_id=name, sender_name=f"webhook {name}",
                    message_id=delivery, received_at=gw.clock.time(), route=route)
    journal = gw.intake.journal
    if journal is not None and route is not None:  # durable before the 202
        if not await journal.accept(key, work, seen_key,
                                    mark_seen=lambda: _new(gw, seen_key)):
            return _duplicate(name, delivery)
    elif await _seen(gw, seen_key):
        return _duplicate(name, delivery)
    try:
        fut = gw.lanes.submit(key, work, mergeable=False)
    except LaneClosed:
        return _refuse(503, "the gateway is stopping; retry", request, name)
    if journal is not None and route is not None:
        journal.watch(work, fut)
    gw.outcomes.watch(work, key, fut)
    log.info("hook_accepted", hook=name, action="turn", session_key=key, run_id=work.run_id,
             delivery=delivery, deliver=hook.deliver)
    if not hook.wait:
        return web.json_response({"ok": True, "session_key": key, "run_id": work.run_id},
                                 status=202)
    try:
        result = await asyncio.wait_for(asyncio.shield(fut), hook.timeout)
    except TimeoutError:
        return web.json_response({"ok": False, "error": "the turn did not finish in time",
                                  "session_key": key, "run_id": work.run_id}, status=504)
    return web.json_response({"ok": result.status == "ok", "reply": result.text,
                              "status": result.status, "session_key": key,
                              "run_id": work.run_id})


async def _new(gw: Any, key: str) -> bool:
    return not await _seen(gw, key)


def _duplicate(name: str, delivery: str) -> web.Response:
    log.info("hook_replayed", hook=name, delivery=delivery)
    return web.json_response({"ok": True, "duplicate": True, "delivery": delivery})
