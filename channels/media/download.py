"""Capped downloads (aiohttp): the announced size is checked before the request and the
running byte count during it, so an oversized file never lands in memory (issue 12
``media.max_bytes``)."""

from __future__ import annotations

import aiohttp

from channels.media.model import MediaTooLarge

CHUNK = 64 * 1024


async def fetch_capped(url: str, *, name: str, max_bytes: int,
                       headers: dict[str, str] | None = None, timeout: float = 60.0,
                       session: aiohttp.ClientSession | None = None) -> bytes:
    """GET ``url`` and return the body. Raises MediaTooLarge when ``Content-Length`` or the
    bytes read exceed ``max_bytes``, aiohttp.ClientResponseError for a non-2xx answer,
    aiohttp.ClientError / TimeoutError for transport trouble (``timeout`` seconds total).
    ``headers`` may carry a bearer token: it is never logged here."""
    own = session is None
    session = session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout))
    try:
        async with session.get(url, headers=headers or {}) as resp:
            resp.raise_for_status()
            if resp.content_length is not None and resp.content_length > max_bytes:
                raise MediaTooLarge(name, resp.content_length, max_bytes)
            buf = bytearray()
            async for chunk in resp.content.iter_chunked(CHUNK):
                buf += chunk
                if len(buf) > max_bytes:
                    raise MediaTooLarge(name, len(buf), max_bytes)
            return bytes(buf)
    finally:
        if own:
            await session.close()
