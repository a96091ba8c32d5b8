"""A small Graph API client for the WhatsApp Cloud API (aiohttp; Meta ships no Python SDK).

Every call is ``<api_base_url>/<version>/...`` with ``Authorization: Bearer <token>``. The
token is only ever put in that header: it is never part of a URL, an exception text or a
log line. Errors come back as Graph error objects::

    {"error": {"message": "...", "type": "OAuthException", "code": 131047,
               "error_subcode": 2494010, "error_data": {"details": "..."},
               "fbtrace_id": "..."}}

and are raised as :class:`GraphError` carrying ``status``, ``code``, ``subcode``,
``retryable`` (5xx, Graph's transient codes) and ``rate_limited``.

Reference: https://developers.facebook.com/docs/whatsapp/cloud-api/reference/messages,
.../reference/media, .../support/error-codes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from channels.media.download import fetch_capped
from channels.media.model import MediaTooLarge

REENGAGEMENT = 131047  # more than 24 hours since the customer last replied
INVALID_TOKEN = 190
# app / account / throughput / pair rate limits (Cloud API error codes)
RATE_LIMIT_CODES = frozenset({4, 80007, 130429, 131056})
# "temporary" / "service unavailable" / "something went wrong" answers
TRANSIENT_CODES = frozenset({1, 2, 131000, 131016})


class GraphError(Exception):
    """A Graph API error answer. ``status`` is the HTTP status (so the shared send loop
    knows a response came: the request certainly did not go unanswered)."""

    def __init__(self, status: int, error: dict[str, Any] | None) -> None:
        err = error or {}
        self.status = status
        self.code = _int(err.get("code"))
        self.subcode = _int(err.get("error_subcode"))
        self.type = str(err.get("type") or "")
        self.fbtrace_id = str(err.get("fbtrace_id") or "")
        details = (err.get("error_data") or {}).get("details") \
            if isinstance(err.get("error_data"), dict) else None
        self.message = str(err.get("message") or f"HTTP {status}")
        self.details = str(details or "")
        self.rate_limited = status == 429 or self.code in RATE_LIMIT_CODES
        self.retryable = status >= 500 or self.rate_limited or self.code in TRANSIENT_CODES
        text = f"Graph API {status}"
        if self.code is not None:
            text += f" code {self.code}"
        super().__init__(f"{text}: {self.message}" + (f" ({self.details})" if self.details
                                                       else ""))

    @property
    def outside_window(self) -> bool:
        return self.code == REENGAGEMENT

    @property
    def token_rejected(self) -> bool:
        return self.status == 401 or self.code == INVALID_TOKEN


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class GraphClient:
    """The Graph API calls of one phone number. ``timeout``: seconds per call. Methods
    raise :class:`GraphError` for an error answer and aiohttp/asyncio errors for
    transport trouble (classified by channels/outbound/send_outcome.py)."""

    def __init__(self, *, base_url: str, version: str, phone_number_id: str, token: str,
                 timeout: float = 30.0) -> None:
        self.root = f"{base_url.rstrip('/')}/{version}"
        self.phone_number_id = phone_number_id
        self._auth = {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """One request to ``<root>/<path>``; returns the JSON object answered."""
        async with self._http().request(method, f"{self.root}/{path.lstrip('/')}",
                                        headers=self._auth, **kwargs) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = None
            if resp.status >= 400 or not isinstance(body, dict) or "error" in body:
                error = body.get("error") if isinstance(body, dict) else None
                raise GraphError(resp.status, error if isinstance(error, dict) else
                                 {"message": f"unexpected answer ({resp.reason})"})
            return body

    async def phone_number(self) -> dict[str, Any]:
        """``GET /{phone-number-id}``: ``{id, display_phone_number, verified_name, ...}``
        (proves the token and the id at start)."""
        return await self.call("GET", self.phone_number_id,
                               params={"fields": "display_phone_number,verified_name"})

    async def send(self, payload: dict[str, Any]) -> str:
        """``POST /{phone-number-id}/messages`` with ``payload`` (``messaging_product`` and
        ``recipient_type`` added); returns the new message's ``wamid``."""
        body = {"messaging_product": "whatsapp", "recipient_type": "individual", **payload}
        answer = await self.call("POST", f"{self.phone_number_id}/messages", json=body)
        messages = answer.get("messages") or [{}]
        return str(messages[0].get("id") or "")

    async def mark_read(self, message_id: str, *, typing: bool = False) -> None:
        """Mark ``message_id`` read (and show the typing indicator, up to 25 s or until
        the reply)."""
        body: dict[str, Any] = {"messaging_product": "whatsapp", "status": "read",
                                "message_id": message_id}
        if typing:
            body["typing_indicator"] = {"type": "text"}
        await self.call("POST", f"{self.phone_number_id}/messages", json=body)

    async def upload(self, path: Path, mime: str) -> str:
        """``POST /{phone-number-id}/media`` (multipart ``file``, ``type``,
        ``messaging_product``); returns the media id."""
        data = await asyncio.to_thread(path.read_bytes)
        form = aiohttp.FormData()
        form.add_field("messaging_product", "whatsapp")
        form.add_field("type", mime)
        form.add_field("file", data, filename=path.name, content_type=mime)
        answer = await self.call("POST", f"{self.phone_number_id}/media", data=form)
        return str(answer.get("id") or "")

    async def download(self, media_id: str, *, name: str, max_bytes: int) -> bytes:
        """An inbound file: ``GET /{media-id}`` for its short-lived ``url`` (and
        ``file_size``), then ``GET url`` with the bearer token. Raises MediaTooLarge past
        ``max_bytes`` (announced or read), GraphError, aiohttp errors."""
        info = await self.call("GET", media_id)
        size = _int(info.get("file_size"))
        if size is not None and size > max_bytes:
            raise MediaTooLarge(name, size, max_bytes)
        url = info.get("url")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise GraphError(200, {"message": f"media {media_id}: no download url"})
        return await fetch_capped(url, name=name, max_bytes=max_bytes, headers=self._auth,
                                  session=self._http())
