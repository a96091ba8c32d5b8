"""A thin HTTP client for OpenAI Chat Completions (``POST {base_url}/chat/completions``),
used by :class:`runtime.providers.openai_provider.OpenAIProvider`.

Why not the official SDK here (issue 9 "A lean model path"): measured on the fake model,
one non-streaming call cost about 3.8 ms of CPU through ``openai`` + httpx2, 3.1 ms with
the SDK's own aiohttp transport (``DefaultAioHttpClient``), and 0.65 ms with one
``aiohttp.ClientSession`` posting a body encoded once and decoding the JSON answer with
``json.loads`` — the SDK's request building and response models were most of a turn's
CPU. The wire protocol is small and stable: a JSON body, a JSON answer or Server-Sent
Events (``data: {chunk}`` lines ending with ``data: [DONE]``), errors as
``{"error": {"message", "type", "code"}}``. Reference: OpenAI API "Create chat
completion", "The chat completion chunk object", "Error codes".

One connection pool per provider: a single ClientSession (keep-alive, unlimited
connections; ``models.providers.<p>.max_concurrent`` is the limit), created on first use
on the running loop. The caller bounds each call's time (``base.guarded_call``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from runtime import telemetry
from runtime.providers.base import ProviderError, redact, status_error

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIHttp:
    """``create(body)`` → the decoded completion; ``stream(body)`` → decoded chunks.

    ``now`` gives epoch seconds (for ``Retry-After`` dates). Every failure raises
    ProviderError (transient for connection errors, cut streams, 408/409/429/5xx; the API
    key is never in the message).
    """

    def __init__(self, name: str, base_url: str | None, api_key: str,
                 headers: dict[str, str] | None, now: Callable[[], float]) -> None:
        self.name = name
        self.url = (base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"
        self._key = api_key
        self._now = now
        self._headers = {"Authorization": f"Bearer {api_key}",
                         "Content-Type": "application/json", **(headers or {})}
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True),
                timeout=aiohttp.ClientTimeout(total=None), headers=self._headers,
                skip_auto_headers=("User-Agent",), raise_for_status=False)
        return self._session

    @staticmethod
    def encode(messages: list[bytes], body: dict[str, Any],
               raw: dict[str, bytes] | None = None) -> bytes:
        """The request body: ``messages`` are already-encoded JSON objects (each encoded
        once, see ``ChatMessage.wire``), ``body`` the other top-level fields, ``raw`` more
        fields whose values are already-encoded JSON (the tool list, encoded once)."""
        rest = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        parts = [b'{"messages":[' + b",".join(messages) + b"]"]
        if len(rest) > 2:
            parts.append(rest[1:-1])
        for key, value in (raw or {}).items():
            parts.append(json.dumps(key).encode() + b":" + value)
        return b",".join(parts) + b"}"

    def _auth(self, api_key: str | None) -> dict[str, str] | None:
        """Per-request headers: Authorization for an auth profile's key (None: the default
        key) and, while tracing, the W3C ``traceparent`` of the model attempt."""
        return telemetry.inject({"Authorization": f"Bearer {api_key}"} if api_key else None)

    async def create(self, messages: list[bytes], body: dict[str, Any],
                     api_key: str | None = None,
                     raw: dict[str, bytes] | None = None) -> dict[str, Any]:
        """One non-streaming call; returns the decoded ``chat.completion`` object.
        ``api_key`` replaces the provider's key for this call (auth profiles)."""
        secret = api_key or self._key
        try:
            async with self._client().post(self.url, data=self.encode(messages, body, raw),
                                           headers=self._auth(api_key)) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise self._status(resp, raw, secret)
        except aiohttp.ClientError as exc:
            raise self._connection(exc, secret) from None
        try:
            data = json.loads(raw)
        except ValueError:
            raise ProviderError(f"{self.name}: the answer is not JSON",
                                kind="bad_response") from None
        if not isinstance(data, dict):
            raise ProviderError(f"{self.name}: the answer is not a JSON object",
                                kind="bad_response")
        return data

    async def stream(self, messages: list[bytes], body: dict[str, Any],
                     api_key: str | None = None,
                     raw: dict[str, bytes] | None = None) -> AsyncIterator[dict[str, Any]]:
        """One streaming call (``stream`` and ``stream_options.include_usage`` are set
        here); yields each decoded chunk until ``data: [DONE]``. A chunk carrying
        ``error`` raises a transient ProviderError."""
        payload = self.encode(messages, {**body, "stream": True,
                                         "stream_options": {"include_usage": True}}, raw)
        secret = api_key or self._key
        try:
            async with self._client().post(self.url, data=payload,
                                           headers=self._auth(api_key)) as resp:
                if resp.status >= 400:
                    raise self._status(resp, await resp.read(), secret)
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue  # blank separators, comments, event: lines
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        continue
                    if isinstance(chunk, dict) and chunk.get("error") is not None:
                        raise status_error(self.name, None, chunk, None, now=self._now(),
                                           secret=secret)
                    if isinstance(chunk, dict):
                        yield chunk
        except aiohttp.ClientError as exc:
            raise self._connection(exc, secret) from None

    def _status(self, resp: aiohttp.ClientResponse, raw: bytes, secret: str) -> ProviderError:
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")[:500]
        return status_error(self.name, resp.status, body, resp.headers, now=self._now(),
                            secret=secret)

    def _connection(self, exc: BaseException, secret: str | None = None) -> ProviderError:
        detail = redact(redact(f"{type(exc).__name__}: {exc}", self._key), secret)[:300]
        return ProviderError(f"{self.name}: connection error ({detail})", transient=True,
                             kind="connection")

    async def close(self) -> None:
        """Close the connection pool (idempotent; a later call opens a new one)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
