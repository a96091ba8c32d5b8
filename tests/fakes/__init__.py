"""Local fake servers that speak real platform protocols, for tests on 127.0.0.1.

Model fakes: ``fake_openai.FakeOpenAI`` (Chat Completions) and
``fake_anthropic.FakeAnthropic`` (Messages). Both build on :class:`ScriptedModelServer`
below, which gives them:

- a queue of scripted replies (``script_text``, ``script_tool_call``, ``script_error``,
  ``script_cut_stream``, ``script_stream_error``, ``script_hang``) and a default
  ``responder(request_json) -> str | dict`` used when the queue is empty (default: echo
  the last user message as ``"echo: <text>"``);
- optional artificial latency (``latency=`` seconds, or ``delay`` per scripted item);
- ``requests``: every request as a :class:`RecordedRequest` (method, path, lower-cased
  headers, JSON body); ``presented_keys()`` lists the API key each model request carried;
- ``api_key=``: a key (or a set of keys) the fake accepts — any other answers 401, the
  way an invalid or revoked key does; None accepts any;
- three ways to run: ``async with FakeOpenAI() as fake`` (tests; ``fake.base_url``), a
  background thread with its own loop (``running = FakeOpenAI.start_in_thread()``,
  ``running.base_url``, ``running.stop()``), or a separate process::

      python -m tests.fakes.fake_openai --port 0 [--script items.json] [--latency 0.1]

  which prints ``READY <base_url>`` on stdout once listening and runs until SIGTERM;
- control endpoints for other processes: ``POST /_script`` (one item or a list),
  ``GET /_requests`` (recorded requests as JSON), ``POST /_reset``, ``GET /_health``.

Script items are JSON objects, so a script file is a JSON list of them::

    {"type": "text", "text": "hi", "usage": {...}, "delay": 0.5}
    {"type": "text", "text": "hi", "thinking": "..."}   (Anthropic, thinking enabled: the
        thinking block's text; see anthropic_thinking.py)
    {"type": "tool_calls", "text": "", "calls": [{"name": "write", "arguments": {...}}]}
        (``arguments`` may be a string: sent verbatim, e.g. malformed JSON; ``id`` optional)
    {"type": "error", "status": 429, "retry_after": 1, "message": "...", "error_type": "...",
     "headers": {"anthropic-ratelimit-requests-reset": "..."}}   (extra response headers)
    {"type": "cut", "text": "partial"}        stream dropped mid-way (no final chunk)
    {"type": "stream_error", "error_type": "overloaded_error"}   error event mid-stream
    {"type": "hang"}                          never answers (until the server closes)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Self

from aiohttp import web


@dataclass
class RecordedRequest:
    """One request a fake received: ``headers`` keys are lower-cased; ``json`` is the parsed
    body (None when empty or not JSON)."""

    method: str
    path: str
    headers: dict[str, str]
    json: Any


def approx_tokens(value: Any) -> int:
    """A deterministic token estimate (~4 characters per token) for fake usage numbers."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return (len(text) + 3) // 4


def split_words(text: str) -> list[str]:
    """Split ``text`` into stream deltas of one word plus its trailing whitespace."""
    return re.findall(r"\s+\S*\s*|\S+\s*", text)


def split_every(text: str, size: int) -> list[str]:
    """Split ``text`` into pieces of ``size`` characters (tool-argument JSON deltas)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class ScriptedModelServer:
    """Shared machinery of the model fakes (see module docstring).

    Subclasses set ``api_root`` (path appended to the server URL to form ``base_url``),
    implement ``add_routes(app)`` and ``last_user_text(body)``.
    """

    api_root = ""

    def __init__(self, *, latency: float = 0.0, host: str = "127.0.0.1", port: int = 0) -> None:
        self.latency = latency
        self.host, self.port = host, port
        self.requests: list[RecordedRequest] = []
        self.responder: Callable[[dict[str, Any]], str | dict[str, Any] | None] | None = None
        self._script: collections.deque[dict[str, Any]] = collections.deque()
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None
        self.url = ""

    # -- scripting -----------------------------------------------------------------------

    def push(self, *items: dict[str, Any]) -> None:
        """Queue raw script items (dicts as in the module docstring)."""
        for item in items:
            if not isinstance(item, dict) or "type" not in item:
                raise ValueError(f"script item needs a 'type': {item!r}")
            self._script.append(dict(item))

    def script_text(self, text: str, *, usage: dict[str, int] | None = None,
                    delay: float | None = None) -> None:
        """Queue a plain text answer (``usage`` overrides the estimated token counts)."""
        self.push({"type": "text", "text": text, "usage": usage, "delay": delay})

    def script_tool_call(self, name: str, arguments: dict[str, Any] | str, *,
                         call_id: str | None = None, text: str = "") -> None:
        """Queue an answer calling one tool; a ``str`` ``arguments`` is sent verbatim."""
        self.script_tool_calls([{"id": call_id, "name": name, "arguments": arguments}], text=text)

    def script_tool_calls(self, calls: list[dict[str, Any]], *, text: str = "") -> None:
        """Queue an answer calling several tools (``[{"name", "arguments", "id"?}]``)."""
        self.push({"type": "tool_calls", "calls": calls, "text": text})

    def script_error(self, status: int, *, retry_after: float | None = None,
                     message: str | None = None, error_type: str | None = None,
                     headers: dict[str, str] | None = None) -> None:
        """Queue an HTTP error response (``retry_after`` seconds → ``Retry-After`` header;
        ``headers`` are added to the response)."""
        self.push({"type": "error", "status": status, "retry_after": retry_after,
                   "message": message, "error_type": error_type, "headers": headers})

    def script_cut_stream(self, text: str = "partial answer that never") -> None:
        """Queue a stream that sends ``text`` and then drops the connection mid-body."""
        self.push({"type": "cut", "text": text})

    def script_stream_error(self, error_type: str = "overloaded_error",
                            message: str = "Overloaded") -> None:
        """Queue a 200 stream carrying an error event after the first event."""
        self.push({"type": "stream_error", "error_type": error_type, "message": message})

    def script_hang(self) -> None:
        """Queue a request that is never answered (released when the server closes)."""
        self.push({"type": "hang"})

    def key_ok(self, presented: str) -> bool:
        """Whether ``presented`` passes ``api_key`` (a key, a set of keys, or None = any)."""
        if self.api_key is None:
            return True
        if isinstance(self.api_key, str):
            return presented == self.api_key
        return presented in self.api_key

    def presented_keys(self) -> list[str]:
        """The API key of every model request so far, in order."""
        out = []
        for r in self.requests:
            if r.path.endswith(("/chat/completions", "/messages")):
                out.append(r.headers.get("x-api-key") or
                           r.headers.get("authorization", "").removeprefix("Bearer "))
        return out

    @property
    def pending(self) -> int:
        """Scripted items not yet consumed."""
        return len(self._script)

    def next_item(self, body: dict[str, Any]) -> dict[str, Any]:
        """The next scripted item, else the responder's answer, else the echo answer."""
        if self._script:
            return self._script.popleft()
        answer = self.responder(body) if self.responder is not None else None
        if answer is None:
            answer = f"echo: {self.last_user_text(body)}"
        if isinstance(answer, str):
            return {"type": "text", "text": answer}
        return dict(answer)

    def last_user_text(self, body: dict[str, Any]) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- helpers for handlers ------------------------------------------------------------

    async def record(self, request: web.Request) -> Any:
        """Record ``request`` and return its JSON body (None if empty or invalid)."""
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.requests.append(
            RecordedRequest(
                method=request.method,
                path=request.path,
                headers={k.lower(): v for k, v in request.headers.items()},
                json=body,
            )
        )
        return body

    async def pause(self, seconds: float | None) -> bool:
        """Sleep ``seconds`` (None = until close); True when the server is closing."""
        assert self._closing is not None
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            return False
        return True

    @staticmethod
    def drop_connection(request: web.Request) -> None:
        """Close the socket under a response being written (a cut stream)."""
        if request.transport is not None:
            request.transport.close()

    # -- lifecycle -----------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        """The URL to give the SDK as ``base_url``."""
        return self.url + self.api_root

    async def start(self) -> str:
        """Listen on ``host:port`` (0 = ephemeral) and return ``base_url``."""
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/_script", self._control_script)
        app.router.add_get("/_requests", self._control_requests)
        app.router.add_post("/_reset", self._control_reset)
        app.router.add_get("/_health", self._control_health)
        self.add_routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{port}"
        return self.base_url

    async def close(self) -> None:
        """Release hung requests and stop listening."""
        if self._closing is not None:
            self._closing.set()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- control endpoints (for a fake running in another process) ------------------------

    async def _control_script(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            self.push(*(body if isinstance(body, list) else [body]))
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"queued": len(self._script)})

    async def _control_requests(self, request: web.Request) -> web.Response:
        return web.json_response([asdict(r) for r in self.requests])

    async def _control_reset(self, request: web.Request) -> web.Response:
        self._script.clear()
        self.requests.clear()
        return web.json_response({"ok": True})

    async def _control_health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "queued": len(self._script)})

    # -- other ways to run ---------------------------------------------------------------

    @classmethod
    def start_in_thread(cls, **kwargs: Any) -> RunningFake:
        """Run a new fake in a daemon thread with its own event loop; returns once listening."""
        loop = asyncio.new_event_loop()
        server = cls(**kwargs)
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(server.start())
            started.set()
            loop.run_forever()
            loop.close()

        thread = threading.Thread(target=run, name=f"{cls.__name__}-thread", daemon=True)
        thread.start()
        if not started.wait(10):
            raise RuntimeError(f"{cls.__name__} did not start")
        return RunningFake(server=server, base_url=server.base_url, thread=thread, loop=loop)

    @classmethod
    def main(cls, argv: list[str] | None = None) -> None:
        """Command line: ``--host``, ``--port``, ``--latency``, ``--script FILE``."""
        parser = argparse.ArgumentParser(description=f"Run {cls.__name__} standalone.")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=0)
        parser.add_argument("--latency", type=float, default=0.0)
        parser.add_argument("--script", help="JSON file holding a list of script items")
        args = parser.parse_args(argv)

        async def serve() -> None:
            server = cls(latency=args.latency, host=args.host, port=args.port)
            if args.script:
                items = json.loads(Path(args.script).read_text(encoding="utf-8"))
                server.push(*(items if isinstance(items, list) else [items]))
            await server.start()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            print(f"READY {server.base_url}", flush=True)
            await stop.wait()
            await server.close()

        asyncio.run(serve())
        sys.exit(0)


@dataclass
class RunningFake:
    """A fake running in a background thread (from ``start_in_thread``)."""

    server: ScriptedModelServer
    base_url: str
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop

    def stop(self, timeout: float = 5.0) -> None:
        """Close the server, stop its loop and join the thread."""
        if not self.loop.is_running():
            return
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
