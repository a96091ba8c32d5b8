"""The ``web_fetch`` and ``web_search`` tools and their per-gateway state (settings and
the 15-minute caches), reached by the handlers through ``ToolContext.extra["web"]``."""

from __future__ import annotations

import json
from typing import Any

import structlog

from runtime.clock import Clock
from runtime.tools.registry import Tool, ToolContext, ToolError, object_schema, require_str
from runtime.tools.web.cache import TTLCache
from runtime.tools.web.config import WebSettings
from runtime.tools.web.untrusted import GUIDANCE, wrap_untrusted

log = structlog.get_logger(__name__)


class WebTools:
    """Settings plus the fetch and search caches (keys: URL, (provider, query, count)).
    The fetch and search clients are imported by the first call (not needed at start)."""

    def __init__(self, settings: WebSettings, clock: Clock) -> None:
        self.settings = settings
        self.fetch_cache = TTLCache(clock, settings.fetch.cache_ttl)
        self.search_cache = TTLCache(clock, settings.search.cache_ttl)
        self.clock = clock

    def reconfigure(self, settings: WebSettings) -> None:
        """Apply reloaded ``tools.web`` settings to the next call. A changed fetch (or
        search) section also empties its cache: a page fetched while ``allow_private``
        or ``allow_hosts`` let it through must not be served once they no longer do."""
        if settings.fetch != self.settings.fetch:
            self.fetch_cache = TTLCache(self.clock, settings.fetch.cache_ttl)
        if settings.search != self.settings.search:
            self.search_cache = TTLCache(self.clock, settings.search.cache_ttl)
        self.settings = settings

    async def fetch(self, url: str, max_chars: int | None) -> str:
        from runtime.tools.web.fetch import FetchFailed, fetch_text
        from runtime.tools.web.guard import FetchRefused
        cfg = self.settings.fetch
        cap = min(max_chars or cfg.max_chars, cfg.max_chars)
        cached = self.fetch_cache.get(url)
        if cached is None:
            try:
                text, fetched = await fetch_text(url, cfg)
            except FetchRefused as exc:
                log.warning("web_fetch_refused", url=url, reason=str(exc))
                raise ToolError(f"refused: {exc}") from None
            except FetchFailed as exc:
                raise ToolError(str(exc)) from None
            cached = (text, fetched.url)
            self.fetch_cache.put(url, cached)
            log.info("web_fetched", url=url, final_url=fetched.url, chars=len(text))
        text, final = cached
        more = len(text) - cap
        body = text[:cap] + (f"\n\n[... {more} more characters not shown ...]" if more > 0
                             else "")
        return wrap_untrusted(final, body)

    async def search(self, query: str, count: int | None) -> str:
        from runtime.tools.web.search import SearchFailed, pick_provider, search
        cfg = self.settings.search
        n = max(1, min(count or cfg.count, 20))
        key = (pick_provider(cfg), query, n)
        results = self.search_cache.get(key)
        if results is None:
            try:
                results = await search(cfg, query, n)
            except SearchFailed as exc:
                raise ToolError(str(exc)) from None
            self.search_cache.put(key, results)
            log.info("web_searched", provider=key[0], results=len(results))
        rows = [{"title": r.title, "url": r.url, "snippet": r.snippet,
                 **({"date": r.date} if r.date else {})} for r in results]
        return wrap_untrusted(f"search: {query}", json.dumps(rows, ensure_ascii=False,
                                                             indent=1))


def _web(ctx: ToolContext) -> WebTools:
    web = ctx.extra.get("web")
    if web is None:
        raise ToolError("web tools are not available in this gateway")
    return web


async def web_fetch_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    url = require_str(args, "url")
    max_chars = args.get("max_chars")
    if max_chars is not None and (not isinstance(max_chars, int) or max_chars < 100):
        raise ToolError("'max_chars' must be an integer >= 100")
    return await _web(ctx).fetch(url, max_chars)


async def web_search_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    query = require_str(args, "query")
    count = args.get("count")
    if count is not None and not isinstance(count, int):
        raise ToolError("'count' must be an integer")
    return await _web(ctx).search(query, count)


WEB_TOOLS = [
    Tool("web_fetch", "Fetch a web page (http/https) and return its main text as Markdown "
         "(JSON and plain text as they are). Optional max_chars. " + GUIDANCE,
         object_schema({"url": {"type": "string"},
                        "max_chars": {"type": "integer", "minimum": 100}}, ["url"]),
         web_fetch_tool, source="web", group="group:web"),
    Tool("web_search", "Search the web; returns title, url, snippet and date of each result. "
         "Optional count (1-20). " + GUIDANCE,
         object_schema({"query": {"type": "string"},
                        "count": {"type": "integer", "minimum": 1, "maximum": 20}}, ["query"]),
         web_search_tool, source="web", group="group:web"),
]
