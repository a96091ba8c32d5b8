"""A fake Slack for tests: Web API, Socket Mode WebSocket and Events API push, on 127.0.0.1.

It speaks enough of the real protocols that the unmodified slack-sdk / slack-bolt clients
work against it (point ``AsyncWebClient(base_url=fake.api_url)`` at it; Socket Mode follows the
``ws://`` URL that ``apps.connections.open`` returns):

- Web API (https://docs.slack.dev/reference/methods): ``POST|GET /api/<method>``, token in
  ``Authorization: Bearer``, args as JSON, form or query; answers ``{"ok": ...}`` with HTTP 200
  (``invalid_auth`` included, as Slack does), 429 + ``Retry-After`` when rate limited.
  Implemented: auth.test, apps.connections.open, chat.postMessage, chat.update (both with
  Block Kit ``blocks``: interactive.py, with button presses), users.info,
  reactions.add, pins.add, assistant.threads.setStatus; anything else answers ``unknown_method``.
- Socket Mode (https://docs.slack.dev/apis/events-api/using-socket-mode): single-use ticket
  URLs, ``hello`` on connect, ``events_api`` envelopes (``envelope_id``, ``retry_attempt``,
  ``retry_reason``), acks recorded, ``disconnect`` (refresh) on request.
- Slash commands (``push_command``): ``slash_commands`` envelopes or signed form POSTs,
  each with a ``response_url`` served here (responses.py: 5 posts in
  30 minutes, ephemeral by default; ``responses.of(url).posts`` shows what was posted).
- Events API over HTTP: events POSTed to a target URL with ``X-Slack-Signature`` (v0 HMAC-SHA256
  of ``v0:{timestamp}:{body}``), ``X-Slack-Request-Timestamp`` and, for retries,
  ``X-Slack-Retry-Num`` / ``X-Slack-Retry-Reason``.
- Slack's retries (opt-in: ``redeliver_after`` seconds, e.g. 3.0 as Slack's ack deadline):
  an ``events_api`` envelope not acked within that time (Socket Mode: no ack frame; HTTP: no
  2xx answer) is delivered again, same event_id, new envelope_id, ``retry_attempt`` + 1, up
  to ``max_retries`` (3) times; with no socket connected it waits for the next connection.
  Real Slack spaces its three retries out (at once, ~1 min, ~5 min); the fake uses one
  interval so tests stay fast. Off by default: the fake then never redelivers by itself.

What the bot did is recorded: ``calls`` (every API request: method, path, payload, status,
error), ``sent`` (write calls Slack accepted: chat.postMessage/update, reactions.add),
``acks`` (Socket Mode acks), ``envelopes`` (events delivered), ``http_responses`` (status of
each HTTP event POST). By default the bot's own posts are echoed back as message events,
as Slack does (``echo_bot_messages``). Failures can be injected: ``fail_next`` (429 +
Retry-After, markup rejection on formatted posts only, any ok:false error, 5xx) and
``set_outage`` (``5xx``, ``drop``: connection closed unanswered, ``refuse``: port closed),
optionally for ``duration`` seconds.

Three ways to run: in-process (``fake = await FakeSlack().start()``; the event builders
``dm``/``message``/``app_mention``/``reaction``/``edit``/``delete`` and ``push_event``,
``redeliver``, ``push_command``, ``push_raw``, ``send_disconnect``), in a thread
(``start_in_thread()`` -> ``.url``, ``.api_url``, ``.control()``, ``.stop()``), or as a process
(``python -m tests.fakes.fake_slack --port 0`` prints ``READY <url>``). Other processes use
the control endpoints: ``GET /_control/{sent,calls,acks,envelopes,http_responses,state}``;
``POST /_control/event`` (``{"event": {...}}`` or ``{"kind": "dm", "text": ...}``),
``/redeliver`` (``envelope_id``), ``/redelivery`` (``after``, ``max_retries``: Slack's
automatic retries), ``/command``, ``/raw``, ``/fail`` (FailRule fields),
``/outage`` (``on``, ``mode``, ``duration``), ``/disconnect``, ``/close_sockets``,
``/http_target`` (``url``: deliver events by signed POST there), ``/reset``.

Layout: this module holds the server (state, lifecycle, failure injection, Web API
dispatch); events.py builds events, delivery.py delivers them (Socket Mode, HTTP),
web_api.py implements the methods, files.py the file flows, control.py ``/_control/*``,
responses.py slash commands' ``response_url``, wire.py the shared pieces.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import urllib.request
from typing import Any, Self
from urllib.parse import parse_qsl

import aiohttp
from aiohttp import web

from tests.fakes.fake_slack.control import ControlRoutes
from tests.fakes.fake_slack.delivery import EventDelivery
from tests.fakes.fake_slack.events import EventBuilders
from tests.fakes.fake_slack.files import FileRoutes
from tests.fakes.fake_slack.interactive import Interactivity
from tests.fakes.fake_slack.responses import ResponseUrls
from tests.fakes.fake_slack.web_api import WebMethods
from tests.fakes.fake_slack.wire import (
    _DROP,
    DEFAULT_USERS,
    WRITE_METHODS,
    FailRule,
    _err,
    channel_type_of,
    dm_channel_of,
    sign,
)

__all__ = ["FailRule", "FakeSlack", "FakeSlackThread", "channel_type_of", "dm_channel_of",
           "sign", "start_in_thread"]


class FakeSlack(EventBuilders, EventDelivery, WebMethods, FileRoutes, ControlRoutes,
                Interactivity):
    """The fake server. ``await start()``; ``url``/``api_url``; ``await stop()``."""

    def __init__(
        self,
        *,
        bot_token: str = "xoxb-fake-bot-token",
        app_token: str = "xapp-fake-app-token",
        signing_secret: str = "fake-signing-secret",
        team_id: str = "T0FAKE",
        app_id: str = "A0FAKE",
        bot_user_id: str = "U0BOT",
        bot_id: str = "B0BOT",
        bot_name: str = "tidegate",
        echo_bot_messages: bool = True,
        users: dict[str, dict[str, Any]] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        redeliver_after: float | None = None,
        max_retries: int = 3,
    ) -> None:
        self.bot_token, self.app_token, self.signing_secret = bot_token, app_token, signing_secret
        self.team_id, self.app_id = team_id, app_id
        self.bot_user_id, self.bot_id, self.bot_name = bot_user_id, bot_id, bot_name
        self.echo_bot_messages = echo_bot_messages
        self.users = dict(DEFAULT_USERS if users is None else users)
        self.host, self.port = host, port
        self.redeliver_after, self.max_retries = redeliver_after, max_retries
        self._acked: set[str] = set()  # envelope ids acked (socket) or answered 2xx (HTTP)
        self.calls: list[dict[str, Any]] = []
        self.sent: list[dict[str, Any]] = []
        self.acks: list[dict[str, Any]] = []
        self.envelopes: list[dict[str, Any]] = []  # every envelope delivered (socket or http)
        # channel -> its messages (user messages pushed, bot posts), for conversations.replies
        self.history: dict[str, list[dict[str, Any]]] = {}
        self.streams: dict[str, bool] = {}  # ts of a chat.startStream message -> still streaming
        self.http_target: str | None = None
        self.http_responses: list[int] = []
        self.rules: list[FailRule] = []
        self.outage: str | None = None  # None | "5xx" | "drop"
        self.connections_opened = 0
        self.files: dict[str, bytes] = {}
        self.file_downloads: list[dict[str, Any]] = []
        self._downloads_open: asyncio.Event | None = None  # set: downloads held (files.py)
        self.pending_uploads: dict[str, dict[str, Any]] = {}
        self.uploads: list[dict[str, Any]] = []  # completed: channel, thread_ts, filename, data
        self._sockets: list[web.WebSocketResponse] = []
        self._tickets: set[str] = set()
        self._pending: list[dict[str, Any]] = []
        self._ts = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._outage_timer: asyncio.TimerHandle | None = None
        self._bg: set[asyncio.Task[Any]] = set()
        self.url = ""
        self.responses = ResponseUrls()  # slash commands' response_url (responses.py)
        self.presses: list[dict[str, Any]] = []  # block_actions payloads (interactive.py)
        self.block_errors: list[str] = []  # why blocks were refused (invalid_blocks)

    # ----------------------------------------------------------------- lifecycle

    @property
    def api_url(self) -> str:
        """Base URL for ``AsyncWebClient(base_url=...)`` (with the trailing slash)."""
        return f"{self.url}/api/"

    @property
    def connected_sockets(self) -> int:
        return sum(1 for ws in self._sockets if not ws.closed)

    async def start(self) -> FakeSlack:
        app = web.Application(middlewares=[self._outage_mw])
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/files-pri/{tail:.*}", self._file_download)
        app.router.add_post("/upload/{file_id}", self._file_upload)
        app.router.add_get("/link/", self._socket)
        app.router.add_post("/_response/{rid}", self.responses.handle)
        app.router.add_get("/_control/{what}", self._control_get)
        app.router.add_post("/_control/{what}", self._control_post)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        await self._listen()
        self.url = f"http://{self.host}:{self.port}"
        self._session = aiohttp.ClientSession()
        return self

    async def stop(self) -> None:
        if self._outage_timer is not None:
            self._outage_timer.cancel()
        for task in list(self._bg):
            task.cancel()
        for ws in list(self._sockets):
            await ws.close()
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ----------------------------------------------------------------- failure injection

    def fail_next(self, method: str = "chat.postMessage", *, kind: str = "ratelimited",
                  count: int = 1, retry_after: int = 1, error: str | None = None,
                  status: int = 500) -> None:
        """Make the next ``count`` matching calls fail (see :class:`FailRule`)."""
        default_error = {"ratelimited": "ratelimited", "markup": "invalid_blocks"}.get(
            kind, "internal_error")
        self.rules.append(FailRule(method, kind, count, retry_after, error or default_error,
                                   status))

    async def set_outage(self, on: bool, mode: str = "5xx",
                         duration: float | None = None) -> None:
        """Start (``on``) or end an outage. Modes: ``5xx`` (every API call answers 503 with
        a text body, new sockets refused), ``drop`` (connections closed without an answer),
        ``refuse`` (the port stops listening: connection refused; the control endpoints go
        with it, so give a ``duration`` when driving it from another process). Socket Mode
        connections are closed. ``duration`` (s) ends the outage automatically."""
        if mode not in ("5xx", "drop", "refuse"):
            raise ValueError(f"unknown outage mode {mode!r}")
        if self._outage_timer is not None:
            self._outage_timer.cancel()
            self._outage_timer = None
        was = self.outage
        self.outage = mode if on else None
        if on:
            for ws in self._live_sockets():
                await ws.close(code=1011, message=b"outage")
            if mode == "refuse" and was != "refuse":
                await self._unlisten()
            if duration:
                loop = asyncio.get_running_loop()
                self._outage_timer = loop.call_later(
                    duration, lambda: self._spawn(self.set_outage(False)))
        elif was == "refuse":
            await self._listen()

    async def _listen(self) -> None:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[-1][1]

    async def _unlisten(self) -> None:
        assert self._runner is not None
        for site in list(self._runner.sites):
            await site.stop()
        server = self._runner.server
        for handler in (server.connections if server is not None else []):
            handler.force_close()  # keep-alive connections would still get through

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def reset(self) -> None:
        """Forget recorded traffic and injected failures."""
        self.calls.clear()
        self.sent.clear()
        self.acks.clear()
        self._acked.clear()
        self.envelopes.clear()
        self.http_responses.clear()
        self.rules.clear()
        self._pending.clear()

    # ----------------------------------------------------------------- waiting (in-process)

    async def wait_for(self, predicate, timeout: float = 5.0) -> None:
        """Poll ``predicate()`` (real time, 10 ms steps); TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("fake-slack: condition not met in time")
            await asyncio.sleep(0.01)

    def chat_view(self, channel: str) -> list[str]:
        """What ``channel`` shows now: the bot's posts after chat.update/chat.delete, in
        posting order (text as sent)."""
        view: dict[str, str] = {}
        for s in self.sent:
            if s["channel"] != channel:
                continue
            if s["method"] in ("chat.postMessage", "chat.update"):
                view[str(s["ts"])] = s["payload"].get("text", "")
            elif s["method"] in ("chat.startStream", "chat.appendStream", "chat.stopStream"):
                ts = str(s["ts"])
                view[ts] = view.get(ts, "") + str(s["payload"].get("markdown_text") or "")
            elif s["method"] == "chat.delete":
                view.pop(str(s["ts"]), None)
        return list(view.values())

    def updates(self, channel: str | None = None) -> list[dict[str, Any]]:
        """Accepted chat.update payloads."""
        return [s["payload"] for s in self.sent if s["method"] == "chat.update"
                and (channel is None or s["channel"] == channel)]

    def messages(self, channel: str | None = None) -> list[dict[str, Any]]:
        """Accepted chat.postMessage payloads (optionally for one resolved channel)."""
        return [s["payload"] for s in self.sent if s["method"] == "chat.postMessage"
                and (channel is None or s["channel"] == channel)]

    # ----------------------------------------------------------------- HTTP handlers

    @web.middleware
    async def _outage_mw(self, request: web.Request, handler):
        if self.outage and not request.path.startswith("/_control/"):
            if self.outage in ("drop", "refuse"):
                if request.transport is not None:
                    request.transport.abort()
                raise web.HTTPServiceUnavailable()  # never reaches the client
            return web.Response(status=503, text="upstream connect error", content_type="text/plain")
        return await handler(request)

    async def _args(self, request: web.Request) -> dict[str, Any]:
        args: dict[str, Any] = dict(request.query)
        if request.can_read_body:
            raw = await request.read()
            if request.content_type == "application/json":
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                if isinstance(body, dict):
                    args.update(body)
            else:
                args.update(parse_qsl(raw.decode("utf-8", "replace")))
        return args

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        args = await self._args(request)
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else args.pop("token", None)
        args.pop("token", None)
        call = {"method": method, "path": request.path, "payload": args,
                "status": 200, "error": None, "at": time.time()}
        self.calls.append(call)
        resp = self._check_token(method, token) or self._injected(method, args)
        if resp is None and method in ("chat.postMessage", "chat.update"):
            resp = self._blocks_refused(args)
        drop = resp is _DROP
        if drop:
            resp = None
        if resp is None:
            handler = {
                "auth.test": self._auth_test, "apps.connections.open": self._connections_open,
                "chat.postMessage": self._post_message, "chat.update": self._chat_update,
                "users.info": self._users_info, "reactions.add": self._ok, "pins.add": self._ok,
                "files.getUploadURLExternal": self._get_upload_url,
                "files.completeUploadExternal": self._complete_upload,
                "chat.delete": self._chat_delete, "reactions.remove": self._ok,
                "assistant.threads.setStatus": self._ok,
                "conversations.replies": self._conversations_replies,
                "conversations.history": self._history,
                "conversations.open": self._open_dm,
                "chat.startStream": self._start_stream,
                "chat.appendStream": self._append_stream,
                "chat.stopStream": self._stop_stream,
            }.get(method)
            resp = handler(args) if handler else _err("unknown_method")
        call["status"] = resp.status
        if resp.status == 200 and isinstance(getattr(resp, "_fake_body", None), dict):
            body = resp._fake_body  # type: ignore[attr-defined]
            call["error"] = body.get("error")
            if body.get("ok") and method in WRITE_METHODS:
                self.sent.append({"method": method, "path": request.path, "payload": args,
                                  "channel": body.get("channel"), "ts": body.get("ts"),
                                  "at": call["at"]})
                if method == "chat.postMessage" and self.echo_bot_messages:
                    self._spawn(self._echo(body))
        elif resp.status == 429:
            call["error"] = "ratelimited"
        if drop and request.transport is not None:
            call["dropped"] = True
            request.transport.close()  # accepted, but the answer never leaves
        return resp


class FakeSlackThread:
    """A FakeSlack running on its own event loop in a daemon thread (for tests that run
    the gateway as a subprocess). ``url``, ``api_url``, ``control()``, ``stop()``."""

    def __init__(self, fake: FakeSlack) -> None:
        self.fake = fake
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-slack", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self.fake.start())
        self._started.set()
        self._loop.run_forever()

    @property
    def url(self) -> str:
        return self.fake.url

    @property
    def api_url(self) -> str:
        return self.fake.api_url

    def control(self, what: str, body: dict[str, Any] | None = None) -> Any:
        """POST ``/_control/<what>`` with a JSON body (GET when ``body`` is None)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}/_control/{what}", data=data,
                                     headers={"Content-Type": "application/json"},
                                     method="GET" if body is None else "POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        fut = asyncio.run_coroutine_threadsafe(self.fake.stop(), self._loop)
        fut.result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def start_in_thread(**kwargs: Any) -> FakeSlackThread:
    """Start a FakeSlack(**kwargs) in a background thread; returns once it listens."""
    handle = FakeSlackThread(FakeSlack(**kwargs))
    handle._thread.start()
    if not handle._started.wait(timeout=10):
        raise RuntimeError("fake-slack did not start")
    return handle
