"""The gateway's one HTTP server (aiohttp, loopback): control API, webchat, the
OpenAI-compatible API and the channels' webhook routes."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web

from channels.openai_api import openai_middlewares, openai_routes
from channels.webchat import webchat_routes
from gateway.server.control_api import bearer_ok, control_routes, result_json
from gateway.sessions.history import webchat_history
from runtime.turn import TurnResult

log = structlog.get_logger(__name__)


@dataclass
class HttpServer:
    runner: web.AppRunner
    port: int
    info_path: Any

    async def close(self) -> None:
        try:
            self.info_path.unlink()
        except FileNotFoundError:
            pass
        await self.runner.cleanup()


class PortInUse(RuntimeError):
    pass


# Every response, the control UI's page first: no other origin may frame it (a page
# that embeds the UI, logged in with the operator's token, could trick clicks on "run
# now" or "disable"). CSP frame-ancestors for current browsers, X-Frame-Options for old.
FRAME_HEADERS = {"Content-Security-Policy": "frame-ancestors 'none'",
                 "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"}


async def _frame_guard(_request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: add :data:`FRAME_HEADERS` to every response. A route's
    own Content-Security-Policy is kept, with ``frame-ancestors 'none'`` appended when it
    has no frame-ancestors directive."""
    csp = response.headers.get("Content-Security-Policy")
    if csp is not None and "frame-ancestors" not in csp:
        response.headers["Content-Security-Policy"] = f"{csp.rstrip('; ')}; frame-ancestors 'none'"
    for name, value in FRAME_HEADERS.items():
        response.headers.setdefault(name, value)


def build_app(gw: Any) -> web.Application:
    """The aiohttp application of every route the gateway serves; every response
    carries :data:`FRAME_HEADERS`."""
    app = web.Application(client_max_size=4 * 1024 * 1024, middlewares=openai_middlewares())
    app.on_response_prepare.append(_frame_guard)
    authorize = lambda request: bearer_ok(request, gw.token)
    app.add_routes(control_routes(gw))
    if gw.config.channels.webchat.enabled:
        app.add_routes(webchat_routes(
            authorize=lambda request: bearer_ok(request, gw.token, allow_query=True),
            submit=gw.local.submit,
            subscribe=lambda run_id, fn: gw.bus.subscribe(fn, run_id=run_id),
            result_payload=result_json,
            history=lambda client: webchat_history(gw, client),
            on_shutdown=app.on_shutdown))
    if gw.config.channels.openai_api.enabled:
        app.add_routes(openai_routes(
            authorize=authorize, agents=lambda: list(gw.agents),
            default_agent=gw.config.default_agent, submit=gw.local.submit,
            subscribe=lambda run_id, fn: gw.bus.subscribe(fn, run_id=run_id),
            result_text=_result_text))
    for ch in gw.channels:
        routes = getattr(ch, "http_routes", None)
        if routes is not None:
            app.add_routes(routes())
    from gateway.channels.boot import pairing_routes
    from gateway.server.scheduler_api import scheduler_routes
    app.add_routes(scheduler_routes(gw))
    from gateway.server.logs_api import logs_routes
    app.add_routes(logs_routes(gw))
    from gateway.server.timeline_api import timeline_routes
    app.add_routes(timeline_routes(gw))
    from gateway.server.memory_api import memory_routes
    app.add_routes(memory_routes(gw))
    from gateway.server.backup_api import backup_routes
    app.add_routes(backup_routes(gw))
    from gateway.server.outcomes_api import outcome_routes
    app.add_routes(outcome_routes(gw))
    from gateway.usage import usage_routes
    app.add_routes(usage_routes(gw))
    if gw.config.metrics.enabled:
        from gateway.server.metrics import metrics_routes
        app.add_routes(metrics_routes(gw))
    app.add_routes(pairing_routes(gw))
    from gateway.subagents import subagent_routes
    app.add_routes(subagent_routes(gw))
    from gateway.approvals.api import approvals_routes
    app.add_routes(approvals_routes(gw))
    from gateway.hooks.routes import hook_routes
    app.add_routes(hook_routes(gw))
    return app


def _result_text(result: Any) -> tuple[str, str]:
    if isinstance(result, TurnResult):
        return result.text, result.status
    return "(interrupted)", "aborted"


async def start_http(gw: Any) -> HttpServer:
    """Start the server on ``gateway.bind``:``gateway.port`` (0 = any free port) and write
    ``<state_dir>/gateway.json`` (pid, port) so the CLI can find it. Raises PortInUse."""
    app = build_app(gw)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    cfg = gw.config.gateway
    site = web.TCPSite(runner, cfg.bind, cfg.port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise PortInUse(f"cannot listen on {cfg.bind}:{cfg.port}: {exc.strerror}; is another "
                        f"gateway running? (set gateway.port)") from None
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    info = gw.state_dir / "gateway.json"
    tmp = info.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "port": port, "bind": cfg.bind}))
    os.replace(tmp, info)
    log.info("http_listening", bind=cfg.bind, port=port)
    return HttpServer(runner, port, info)
