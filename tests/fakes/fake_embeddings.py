"""A fake OpenAI-compatible embeddings server (``POST /v1/embeddings``): deterministic
vectors the test controls.

Each vector has one axis per entry of ``concepts`` (a list of word sets): axis i counts
the input's words found in ``concepts[i]``, plus a small constant last axis so no vector
is zero. Two texts that share no word but name the same concept are therefore close,
as a real embedding model would place paraphrases. ``fail(status, count)`` scripts error
answers; ``requests`` records each request's inputs; ``api_key`` makes it answer 401 to
other bearer tokens; ``dims`` set cuts or zero-pads every vector to that size (a server
that ignores ``dimensions``). Protocol: OpenAI API "Create embeddings".
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web


class FakeEmbeddings:
    def __init__(self, concepts: list[set[str]], *, api_key: str | None = None) -> None:
        self.concepts = [{w.lower() for w in c} for c in concepts]
        self.api_key = api_key
        self.requests: list[list[str]] = []
        self.failures: list[int] = []
        self.dims: int | None = None
        self.url = ""
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def vector(self, text: str) -> list[float]:
        words = set(re.findall(r"[a-z0-9']+", text.lower()))
        vec = [float(len(words & c)) for c in self.concepts] + [0.05]
        return vec if self.dims is None else (vec + [0.0] * self.dims)[:self.dims]

    def fail(self, status: int = 500, count: int = 1) -> None:
        self.failures.extend([status] * count)

    async def _embeddings(self, request: web.Request) -> web.Response:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "Incorrect API key"}}, status=401)
        body = await request.json()
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not body.get("model") or not isinstance(inputs, list) or not inputs:
            return web.json_response({"error": {"message": "model and input are required"}},
                                     status=400)
        self.requests.append(list(inputs))
        if self.failures:
            status = self.failures.pop(0)
            return web.json_response({"error": {"message": "The server had an error"}},
                                     status=status)
        data: list[dict[str, Any]] = [{"object": "embedding", "index": i,
                                       "embedding": self.vector(t)}
                                      for i, t in enumerate(inputs)]
        return web.json_response({"object": "list", "data": data, "model": body["model"],
                                  "usage": {"prompt_tokens": 1, "total_tokens": 1}})

    async def start(self) -> FakeEmbeddings:
        app = web.Application()
        app.router.add_post("/v1/embeddings", self._embeddings)
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
