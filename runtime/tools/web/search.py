"""``web_search`` providers behind one interface (issue 12): Brave Search API, a SearXNG
instance's JSON API, Tavily. Each returns ``SearchResult`` lists; the provider is
``tools.web.search.provider`` or, unset, the first with a key/base_url (brave, tavily,
searxng).

APIs: Brave ``GET /res/v1/web/search`` (header ``X-Subscription-Token``), SearXNG
``GET /search?format=json``, Tavily ``POST /search`` (``Authorization: Bearer``).
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from runtime.tools.web.config import SearchSettings

DEFAULT_URLS = {"brave": "https://api.search.brave.com", "tavily": "https://api.tavily.com"}


class SearchFailed(Exception):
    """The provider failed or is not configured (message for the model, no key in it)."""


@dataclass(slots=True)
class SearchResult:
    title: str
    url: str
    snippet: str = ""
    date: str | None = None


def pick_provider(settings: SearchSettings) -> str | None:
    """The configured provider, or the first one that has what it needs; None: none."""
    if settings.provider:
        return settings.provider
    if settings.brave.api_key:
        return "brave"
    if settings.tavily.api_key:
        return "tavily"
    if settings.searxng.base_url:
        return "searxng"
    return None


async def search(settings: SearchSettings, query: str, count: int) -> list[SearchResult]:
    """Run ``query`` on the chosen provider. Raises SearchFailed."""
    name = pick_provider(settings)
    if name is None:
        raise SearchFailed("no search provider is configured (tools.web.search: brave, "
                           "searxng or tavily)")
    cfg = getattr(settings, name)
    base = (cfg.base_url or DEFAULT_URLS.get(name) or "").rstrip("/")
    if not base:
        raise SearchFailed(f"tools.web.search.{name}.base_url is not set")
    if name != "searxng" and not cfg.api_key:
        raise SearchFailed(f"tools.web.search.{name}.api_key is not set")
    timeout = aiohttp.ClientTimeout(total=settings.timeout)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            data = await _CALLS[name](session, base, cfg.api_key, query, count)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        detail = str(exc).replace(cfg.api_key, "***") if cfg.api_key else str(exc)
        raise SearchFailed(f"{name} search failed: {type(exc).__name__}: "
                           f"{detail[:200]}") from None
    return _PARSE[name](data)[:count]


async def _brave(session, base, key, query, count):
    async with session.get(f"{base}/res/v1/web/search", params={"q": query, "count": count},
                           headers={"X-Subscription-Token": key,
                                    "Accept": "application/json"}) as resp:
        resp.raise_for_status()
        return await resp.json()


async def _searxng(session, base, key, query, count):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.get(f"{base}/search", params={"q": query, "format": "json"},
                           headers=headers) as resp:
        resp.raise_for_status()
        return await resp.json()


async def _tavily(session, base, key, query, count):
    async with session.post(f"{base}/search", json={"query": query, "max_results": count},
                            headers={"Authorization": f"Bearer {key}"}) as resp:
        resp.raise_for_status()
        return await resp.json()


def _parse_brave(data) -> list[SearchResult]:
    items = ((data or {}).get("web") or {}).get("results") or []
    return [SearchResult(str(i.get("title", "")), str(i.get("url", "")),
                         str(i.get("description", "")), i.get("page_age") or i.get("age"))
            for i in items if isinstance(i, dict) and i.get("url")]


def _parse_searxng(data) -> list[SearchResult]:
    items = (data or {}).get("results") or []
    return [SearchResult(str(i.get("title", "")), str(i.get("url", "")),
                         str(i.get("content", "")), i.get("publishedDate"))
            for i in items if isinstance(i, dict) and i.get("url")]


def _parse_tavily(data) -> list[SearchResult]:
    items = (data or {}).get("results") or []
    return [SearchResult(str(i.get("title", "")), str(i.get("url", "")),
                         str(i.get("content", "")), i.get("published_date"))
            for i in items if isinstance(i, dict) and i.get("url")]


_CALLS = {"brave": _brave, "searxng": _searxng, "tavily": _tavily}
_PARSE = {"brave": _parse_brave, "searxng": _parse_searxng, "tavily": _parse_tavily}
