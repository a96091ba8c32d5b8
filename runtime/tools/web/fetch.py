"""``web_fetch``: GET a URL with aiohttp under a timeout, a body cap and a redirect cap,
every hop through the SSRF guard, and turn HTML into Markdown with trafilatura (plain text
and JSON are returned as they are). Issue 12 "Web tools"."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urljoin

import aiohttp
import structlog

from runtime.tools.web.config import FetchSettings
from runtime.tools.web.guard import FetchRefused, GuardedResolver, check_url

log = structlog.get_logger(__name__)

TEXT_TYPES = ("text/plain", "application/json", "text/markdown", "text/csv")
HTML_TYPES = ("text/html", "application/xhtml+xml")


class FetchFailed(Exception):
    """The fetch did not produce content (status, size, type); message for the model."""


@dataclass(slots=True)
class Fetched:
    """A fetched resource: final ``url`` (after redirects), HTTP ``status``, ``content_type``
    and the raw ``body`` bytes (at most ``max_bytes``)."""

    url: str
    status: int
    content_type: str
    body: bytes


async def fetch_raw(url: str, settings: FetchSettings) -> Fetched:
    """Follow up to ``max_redirects`` redirects, checking each URL. Raises FetchRefused,
    FetchFailed, TimeoutError or aiohttp.ClientError."""
    trusted = frozenset(h.lower() for h in settings.allow_hosts)
    resolver = GuardedResolver(allow_private=settings.allow_private, allow_hosts=trusted)
    connector = aiohttp.TCPConnector(resolver=resolver, limit=4)
    timeout = aiohttp.ClientTimeout(total=settings.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     headers={"User-Agent": settings.user_agent}) as session:
        for _hop in range(settings.max_redirects + 1):
            check_url(url, allow_private=settings.allow_private, allow_hosts=trusted)
            async with session.get(url, allow_redirects=False) as resp:
                if resp.status in (301, 302, 303, 307, 308) and "Location" in resp.headers:
                    url = urljoin(url, resp.headers["Location"])
                    continue
                return Fetched(url, resp.status, resp.content_type or "",
                               await _capped_body(resp, settings.max_bytes))
    raise FetchFailed(f"more than {settings.max_redirects} redirects")


async def _capped_body(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    buf = bytearray()
    async for chunk in resp.content.iter_chunked(64 * 1024):
        buf += chunk
        if len(buf) > max_bytes:
            raise FetchFailed(f"the response is larger than {max_bytes} bytes")
    return bytes(buf)


def to_text(fetched: Fetched) -> str:
    """Markdown of an HTML page (trafilatura main-text extraction, links kept), the body of
    a text/JSON resource. Raises FetchFailed for other types or an empty extraction.
    Blocking (trafilatura): call it in a thread."""
    ctype = fetched.content_type.lower()
    text = fetched.body.decode("utf-8", errors="replace")
    if ctype.startswith(TEXT_TYPES) or ctype.endswith("+json"):
        return text
    if not ctype.startswith(HTML_TYPES):
        raise FetchFailed(f"content type {ctype or 'unknown'} is not text or HTML")
    import trafilatura

    md = trafilatura.extract(text, url=fetched.url, output_format="markdown",
                             include_links=True, include_tables=True, favor_recall=True)
    if not md:
        raise FetchFailed("no readable text found on the page")
    title = trafilatura.extract_metadata(text)
    heading = f"# {title.title}\n\n" if title is not None and title.title else ""
    return heading + md


async def fetch_text(url: str, settings: FetchSettings) -> tuple[str, Fetched]:
    """(text, fetched) for ``url``: raises FetchRefused/FetchFailed (4xx/5xx included)."""
    try:
        fetched = await fetch_raw(url, settings)
    except FetchRefused:
        raise
    except aiohttp.ClientConnectorError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, FetchRefused):
            raise cause from None
        raise FetchFailed(f"could not connect: {exc}") from None
    except TimeoutError:  # its text is empty: say what timed out and after how long
        raise FetchFailed(f"no complete answer from {url} within {settings.timeout:g}s "
                          "(tools.web.fetch.timeout)") from None
    except aiohttp.ClientError as exc:
        raise FetchFailed(f"{type(exc).__name__}: {exc}") from None
    if fetched.status >= 400:
        raise FetchFailed(f"HTTP {fetched.status} from {fetched.url}")
    return await asyncio.to_thread(to_text, fetched), fetched
