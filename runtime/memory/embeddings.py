"""Embeddings through an OpenAI-compatible ``POST {base_url}/embeddings`` (OpenAI, Ollama,
vLLM, llama.cpp, LM Studio, any compatible server).

Request ``{"model", "input": [str, ...], "encoding_format": "float", "dimensions"?}``;
answer ``{"data": [{"index", "embedding": [float, ...]}, ...]}`` (reordered by ``index``);
errors ``{"error": {"message"}}`` with an HTTP status (reference: OpenAI API "Create
embeddings"). Inputs go in batches of ``batch_size``. Keys come from the provider's auth
profiles (runtime/providers/failover/): a 401/403/429 moves on to the next profile; any
other failure raises :class:`EmbeddingError` at once (search falls back to BM25). One
``aiohttp.ClientSession`` per embedder, created on first use on the running loop.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

KeySource = Callable[[], Awaitable[list[tuple[str, str]]]]
"""Returns the (profile id, key) pairs to try, in order."""


class EmbeddingError(Exception):
    """The embeddings endpoint failed (status, connection, malformed answer). The message
    never contains a key."""


@dataclass
class Embedder:
    """``embed(texts)`` -> one vector (list of floats) per text, in order.

    ``url`` is the provider's base URL (``.../v1``); ``timeout`` seconds per request.
    ``requests`` counts HTTP requests sent (status and tests read it)."""

    url: str
    model: str
    dimensions: int | None = None
    batch_size: int = 64
    timeout: float = 30.0
    keys: KeySource | None = None
    headers: dict[str, str] = field(default_factory=dict)
    requests: int = 0
    _session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers={"Content-Type": "application/json", **self.headers})
        return self._session

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors of ``texts`` (batched). Raises EmbeddingError."""
        out: list[list[float]] = []
        for i in range(0, len(texts), self.batch_size):
            out.extend(await self._batch(list(texts[i:i + self.batch_size])))
        return out

    async def _batch(self, texts: list[str]) -> list[list[float]]:
        body: dict = {"model": self.model, "input": texts, "encoding_format": "float"}
        if self.dimensions:
            body["dimensions"] = self.dimensions
        payload = json.dumps(body).encode()
        keys = await self.keys() if self.keys is not None else [("default", "")]
        last = "no credential"
        for profile, key in keys or [("default", "")]:
            auth = {"Authorization": f"Bearer {key}"} if key else {}
            self.requests += 1
            try:
                async with self._client().post(self.url.rstrip("/") + "/embeddings",
                                               data=payload, headers=auth) as resp:
                    text = await resp.text()
                    status = resp.status
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise EmbeddingError(f"embeddings request failed: {type(exc).__name__}: "
                                     f"{exc}") from None
            if status in (401, 403, 429):
                last = f"HTTP {status} with profile {profile}"
                continue
            if status != 200:
                raise EmbeddingError(f"embeddings endpoint answered HTTP {status}: "
                                     f"{_message(text, key)}")
            return _vectors(text, len(texts))
        raise EmbeddingError(f"embeddings refused by every auth profile ({last})")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _message(text: str, key: str = "") -> str:
    """The error message of an answer, without ``key`` (a server may echo it back)."""
    if key:
        text = text.replace(key, "***")
    try:
        return str(json.loads(text)["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return text[:200]


def _vectors(text: str, n: int) -> list[list[float]]:
    try:
        data = json.loads(text)["data"]
        rows = sorted(data, key=lambda d: d["index"])
        vecs = [[float(x) for x in d["embedding"]] for d in rows]
    except (ValueError, KeyError, TypeError) as exc:
        raise EmbeddingError(f"malformed embeddings answer: {exc}") from None
    if len(vecs) != n or any(len(v) != len(vecs[0]) or not v for v in vecs):
        raise EmbeddingError(f"embeddings answer has {len(vecs)} vectors for {n} inputs "
                             "or uneven dimensions")
    return vecs
