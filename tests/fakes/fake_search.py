"""Fake web search APIs on 127.0.0.1 for the web_search tests: the Brave Search API
(``GET /res/v1/web/search``, ``X-Subscription-Token``), SearXNG's JSON API
(``GET /search?format=json``) and Tavily (``POST /search``, bearer key), answering in
each provider's real response shape. ``requests`` records (provider, query, headers)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

BRAVE_KEY = "brave-test-key"
TAVILY_KEY = "tvly-test-key"


class FakeSearch:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    def _hits(self, query: str) -> list[tuple[str, str, str]]:
        return [(f"{query} — result {i}", f"https://example.org/{i}?q={query.replace(' ', '+')}",
                 f"Snippet {i} about {query}") for i in range(1, 4)]

    async def _brave(self, request: web.Request) -> web.Response:
        q = request.query.get("q", "")
        self.requests.append({"provider": "brave", "query": q,
                              "count": request.query.get("count"),
                              "token": request.headers.get("X-Subscription-Token")})
        if request.headers.get("X-Subscription-Token") != BRAVE_KEY:
            return web.json_response({"type": "ErrorResponse", "error": {
                "code": "SUBSCRIPTION_TOKEN_INVALID", "status": 422}}, status=422)
        return web.json_response({"type": "search", "query": {"original": q}, "web": {
            "type": "search", "results": [
                {"title": t, "url": u, "description": d, "page_age": "2026-11-30T08:00:00",
                 "age": "1 day ago"} for t, u, d in self._hits(q)]}})

    async def _searxng(self, request: web.Request) -> web.Response:
        q = request.query.get("q", "")
        self.requests.append({"provider": "searxng", "query": q,
                              "format": request.query.get("format")})
        if request.query.get("format") != "json":
            return web.Response(status=403, text="format not allowed")
        return web.json_response({"query": q, "number_of_results": 3, "results": [
            {"title": t, "url": u, "content": d, "engine": "fake",
             "publishedDate": "2026-11-29T00:00:00"} for t, u, d in self._hits(q)]})

    async def _tavily(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"provider": "tavily", "query": body.get("query"),
                              "auth": request.headers.get("Authorization")})
        if request.headers.get("Authorization") != f"Bearer {TAVILY_KEY}":
            return web.json_response({"detail": {"error": "Unauthorized"}}, status=401)
        return web.json_response({"query": body.get("query"), "results": [
            {"title": t, "url": u, "content": d, "score": 0.9}
            for t, u, d in self._hits(body.get("query", ""))]})

    async def start(self) -> FakeSearch:
        app = web.Application()
        app.router.add_get("/res/v1/web/search", self._brave)
        app.router.add_get("/search", self._searxng)
        app.router.add_post("/search", self._tavily)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
