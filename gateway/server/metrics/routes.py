"""``GET /metrics`` on the gateway's HTTP server."""

from __future__ import annotations

from typing import Any

from aiohttp import web

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics_routes(gw: Any) -> list[web.RouteDef]:
    """``GET /metrics``: the gateway token, or none with ``metrics.public_loopback``."""
    from gateway.server.control_api import bearer_ok

    async def metrics(request: web.Request) -> web.Response:
        """Prometheus text format (token, or none with ``metrics.public_loopback``)."""
        if not gw.config.metrics.public_loopback and not bearer_ok(request, gw.token):
            return web.json_response({"ok": False, "error": "unauthorized"}, status=401,
                                     headers={"WWW-Authenticate": "Bearer"})
        return web.Response(body=gw.metrics.render(),
                            headers={"Content-Type": CONTENT_TYPE})

    return [web.get("/metrics", metrics)]
