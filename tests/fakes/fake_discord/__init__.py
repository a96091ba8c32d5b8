"""A fake Discord: REST API v10 and gateway WebSocket on 127.0.0.1, for tests.

Speaks enough of the real protocols that discord.py 2.x works against it unmodified
(point ``discord.http.Route.BASE`` at :attr:`FakeDiscord.api_url` and
``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY`` at :attr:`FakeDiscord.gateway_url`):

- Gateway (Discord developer docs, "events/gateway"): HELLO with
  ``heartbeat_interval``, HEARTBEAT -> HEARTBEAT_ACK, IDENTIFY -> READY + GUILD_CREATE
  (channels, threads, roles, the bot's member), RESUME -> the missed dispatches after
  ``seq`` + RESUMED (or INVALID_SESSION; gateway_ws.py),
  close 4004 on a bad token and 4014 when the message content intent is requested but not
  "enabled in the portal". Dispatches MESSAGE_CREATE/UPDATE/DELETE, MESSAGE_REACTION_ADD,
  THREAD_CREATE; like Discord it echoes the bot's own messages back as MESSAGE_CREATE and
  blanks ``content`` of guild messages that do not mention the bot when the connection
  lacks the message content intent.
- REST: ``GET /users/@me``, ``GET /oauth2/applications/@me``, ``GET /users/{id}``,
  ``POST /users/@me/channels``, ``GET /channels/{id}``, ``GET /channels/{id}/messages``
  (``after``, ``limit``), ``POST /channels/{id}/messages``
  (2000-character limit, 50035 Invalid Form Body), ``POST /channels/{id}/typing``,
  ``GET /gateway[/bot]``. Responses carry the bare ``Content-Type: application/json``
  discord.py insists on; 429s carry ``Via`` and ``retry_after`` so discord.py retries them.

Everything the bot sent over REST is in :attr:`FakeDiscord.sent` (dicts with ``method``,
``path``, ``payload``, ``status``, ``at`` monotonic seconds); gateway frames from the bot are
in :attr:`FakeDiscord.gateway_log` (tokens removed). Failures: :meth:`fail_next_sends`
(429 / markup rejection / any status), :meth:`set_outage` (503 everywhere, or connection
refused). :func:`start_in_thread` runs it on its own event loop; control endpoints let a
test in another process drive it (JSON bodies; users by name "alice"/"bob"/"otherbot"/
"tidebot" or id; each returns the payload it dispatched):

- ``POST /_control/dm`` ``{"text", "user"?, "message_id"?}``
- ``POST /_control/message`` ``{"text", "user"?, "channel_id"?, "mention"?,
  "role_mention"?, "reply_to_bot"?, "message_id"?}`` (thread: ``channel_id`` = thread id)
- ``POST /_control/reaction`` ``{"message_id", "emoji"?, "user"?, "channel_id"?, "guild"?}``
- ``POST /_control/edit`` ``{"message_id" | "message", "text"}``, ``/_control/delete``
  ``{"message_id" | "message"}``, ``/_control/thread`` ``{"name"?, "parent_id"?}``
- ``POST /_control/command`` ``{"name", "value"?, "user"?, "channel_id"?, "guild"?}``: a
  user runs a registered application command (interactions.py, which
  also serves command registration, interaction callbacks and webhook follow-ups)
- ``POST /_control/dispatch`` ``{"event", "data"}`` (anything, malformed included)
- ``POST /_control/fail`` ``{"kind": "429"|"markup"|"status", "count"?, "retry_after"?,
  "status"?, "global"?}``; ``POST /_control/outage`` ``{"down": bool, "mode"?: "503"|
  "refuse"}``; ``POST /_control/reset`` (clears ``sent``, gateway log, failures)
- ``GET /_control/sent`` -> ``{"sent": [...]}``; ``GET /_control/state`` -> connection
  counts, ids of the bot/guild/channels/users, gateway log.

``python -m tests.fakes.fake_discord [--port N]`` runs it standalone and prints
``{"url": ..., "api_url": ..., "gateway_url": ...}`` on stdout (SIGTERM stops it).

Layout: this module holds the server (state, lifecycle, REST middleware and dispatch);
payloads.py builds Discord's JSON objects, inject.py what users do, gateway_ws.py the
gateway WebSocket, messages.py the message routes, control.py ``/_control/*``,
interactions.py application commands and interactions, wire.py the shared pieces.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.fake_discord.components import Components
from tests.fakes.fake_discord.control import ControlRoutes
from tests.fakes.fake_discord.gateway_ws import GatewaySocket
from tests.fakes.fake_discord.inject import Injection
from tests.fakes.fake_discord.interactions import Interactions
from tests.fakes.fake_discord.messages import MessageRoutes
from tests.fakes.fake_discord.payloads import Payloads
from tests.fakes.fake_discord.wire import (
    DISCORD_EPOCH_MS,
    PAYLOAD,
    Conn,
    Failure,
    FakeUser,
    Session,
    error,
    json_response,
)

__all__ = ["FakeDiscord", "FakeUser", "ThreadHandle", "start_in_thread"]

@dataclass
class FakeDiscord(Payloads, Injection, GatewaySocket, MessageRoutes, ControlRoutes,
                  Components):
    """The fake server. Start with ``await fake.start()`` (same loop as the test) or
    :func:`start_in_thread`. Ids are strings, like Discord's JSON."""

    token: str = "fake-discord-token"
    privileged_intents: bool = True
    heartbeat_interval_ms: int = 41_250
    echo_own_messages: bool = True
    refuse_threads: bool = False  # starting a thread from a message answers 403 50013

    sent: list[dict[str, Any]] = field(default_factory=list)
    gateway_log: list[dict[str, Any]] = field(default_factory=list)
    identify_count: int = 0
    resume_count: int = 0
    files: dict[str, bytes] = field(default_factory=dict)  # served under /attachments/
    file_downloads: list[str] = field(default_factory=list)
    uploads: list[dict[str, Any]] = field(default_factory=list)  # messages with files

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self.bot = FakeUser(self.new_id(), "tidebot", "Tide Bot", bot=True)
        self.alice = FakeUser(self.new_id(), "alice", "Alice A.")
        self.bob = FakeUser(self.new_id(), "bob", None)
        self.other_bot = FakeUser(self.new_id(), "otherbot", "Other Bot", bot=True)
        self.users = {u.id: u for u in (self.bot, self.alice, self.bob, self.other_bot)}
        self.guild_id = self.new_id()
        self.bot_role_id = self.new_id()
        self.channel_id = self.new_id()  # #general
        self.other_channel_id = self.new_id()  # #random
        self.thread_id = self.new_id()  # a thread under #general
        self.dm_channels: dict[str, str] = {}  # user id -> DM channel id
        self.messages: dict[str, dict[str, Any]] = {}
        self.bot_reactions: dict[str, list[str]] = {}  # message id -> the bot's emoji
        self._threads: dict[str, dict[str, Any]] = {}  # created by create_thread
        self._conns: set[Conn] = set()
        self._sessions: dict[str, Session] = {}  # gateway sessions (gateway_ws.py)
        self.resumes: list[dict[str, Any]] = []  # every RESUME the bot sent
        self._tasks: set[asyncio.Task] = set()
        self._failures: list[Failure] = []
        self.nonce_replays = 0  # creates answered with an earlier message (enforce_nonce)
        self._outage: str | None = None  # None | "503" | "refuse"
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port = 0
        self.interactions = Interactions(self)  # application commands (interactions.py)

    # ------------------------------------------------------------------ ids, urls

    def new_id(self) -> str:
        """A fresh snowflake (timestamp bits = now, so discord.py's created_at is sane)."""
        ms = int(time.time() * 1000) - DISCORD_EPOCH_MS
        return str((ms << 22) | (next(self._ids) & 0x3FFFFF))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/v10"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/gateway"

    # ------------------------------------------------------------------ lifecycle

    async def start(self, port: int = 0) -> str:
        """Listen on 127.0.0.1 (``port`` 0 = ephemeral); returns :attr:`url`."""
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get("/resume-gateway", self._gateway)
        app.router.add_get("/attachments/{tail:.*}", self._attachment_file)
        app.router.add_route("*", "/_control/{action}", self._control)
        app.router.add_route("*", "/api/{version}/{tail:.*}", self._api)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", port)
        await self._site.start()
        self.port = self._runner.addresses[0][1]
        return self.url

    async def stop(self) -> None:
        """Close every gateway connection and stop listening (idempotent)."""
        await self.close_gateways(1001)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def close_gateways(self, code: int = 1011) -> None:
        """Close all gateway connections with ``code`` (1011/4000: the client resumes)."""
        for conn in list(self._conns):
            conn.kicked = True  # the session stays resumable
            await conn.ws.close(code=code, message=b"fake closed")
        self._conns.clear()

    def expire_sessions(self) -> None:
        """Forget every gateway session (Discord's session timeout): a RESUME of any of
        them is answered with op 9 Invalid Session."""
        self._sessions.clear()

    async def set_outage(self, down: bool, mode: str = "503") -> None:
        """Start/end an outage. ``mode`` "503": REST and gateway handshakes answer 503;
        "refuse": the listening socket is closed (connection refused) until recovery."""
        if down:
            self._outage = mode
            await self.close_gateways(1011)
            if mode == "refuse" and self._site is not None:
                await self._site.stop()
        else:
            if self._outage == "refuse" and self._runner is not None:
                self._site = web.TCPSite(self._runner, "127.0.0.1", self.port)
                await self._site.start()
            self._outage = None

    def fail_next_sends(self, count: int = 1, kind: str = "429", *, retry_after: float = 1.0,
                        status: int = 503, is_global: bool = False) -> None:
        """Make the next ``count`` ``POST /channels/{id}/messages`` fail: ``kind`` "429"
        (rate limited, ``retry_after`` seconds), "markup" (400 Invalid Form Body on
        ``content``), "status" (HTTP ``status`` with a JSON error body) or "drop" (the
        message is created, then the connection is closed before any response: the
        sender cannot know it arrived)."""
        if kind not in ("429", "markup", "status", "drop"):
            raise ValueError(f"unknown failure kind {kind!r}")
        self._failures.append(Failure(kind, count, retry_after, status, is_global))

    @property
    def connected(self) -> int:
        """Number of identified/resumed gateway connections."""
        return sum(1 for c in self._conns if c.ready)

    async def wait_for(self, pred: Callable[[], bool], timeout: float = 5.0) -> None:
        """Poll ``pred`` until true; raises TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not met in time")
            await asyncio.sleep(0.01)

    def sent_messages(self, channel_id: str | None = None) -> list[dict[str, Any]]:
        """Successful ``POST /channels/{id}/messages`` calls (optionally for one channel)."""
        out = []
        for s in self.sent:
            ok_post = (s["method"] == "POST" and s["path"].endswith("/messages")
                       and s["status"] == 200)
            if ok_post and channel_id in (None, s["path"].split("/")[2]):
                out.append(s)
        return out

    # ------------------------------------------------------------------ REST

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith("/api/"):
            return await handler(request)
        payload: Any = None
        if request.content_type == "multipart/form-data":  # a message with file uploads
            form = await request.post()
            payload = json.loads(str(form.get("payload_json") or "{}"))
            payload["_files"] = [{"filename": v.filename, "data": v.file.read()}
                                 for k, v in form.items() if isinstance(v, web.FileField)]
        elif request.can_read_body:
            raw = await request.read()
            try:
                payload = json.loads(raw) if raw else None
            except ValueError:
                payload = raw.decode("utf-8", "replace")
        path = "/" + request.match_info.get("tail", "")
        record: dict[str, Any] = {"method": request.method, "path": path, "payload": payload,
                                  "status": 0, "at": time.monotonic()}
        self.sent.append(record)
        request[PAYLOAD] = payload
        if self._outage:
            resp: web.StreamResponse = error(503, 0, "Service Unavailable")
        elif request.headers.get("Authorization") != f"Bot {self.token}" \
                and not self.interactions.is_token_route(path):
            resp = error(401, 0, "401: Unauthorized")
        else:
            resp = await handler(request)
        record["status"] = resp.status
        if getattr(resp, "_fake_drop", False) and request.transport is not None:
            record["dropped"] = True
            request.transport.close()  # accepted, but the answer never leaves
        return resp

    def _take_failure(self) -> Failure | None:
        while self._failures and self._failures[0].remaining <= 0:
            self._failures.pop(0)
        if not self._failures:
            return None
        f = self._failures[0]
        f.remaining -= 1
        return f

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method, tail = request.method, request.match_info["tail"].strip("/")
        parts = tail.split("/")
        body = request.get(PAYLOAD) or {}
        routed = await self.interactions.route(method, parts, request.get(PAYLOAD),
                                               request.query)
        if routed is not None:
            return routed
        if method == "GET" and tail == "users/@me":
            return json_response({**self.bot.payload(), "verified": True, "flags": 0,
                          "mfa_enabled": False, "locale": "en-US"})
        if method == "GET" and tail == "oauth2/applications/@me":
            return json_response({"id": self.bot.id, "name": "tidebot", "icon": None,
                          "description": "", "bot_public": False,
                          "bot_require_code_grant": False, "owner": self.alice.payload(),
                          "verify_key": "00" * 32, "flags": 0, "team": None,
                          "summary": "", "rpc_origins": []})
        if method == "GET" and tail in ("gateway", "gateway/bot"):
            return json_response({"url": self.gateway_url.removesuffix("/gateway") + "/gateway",
                          "shards": 1, "session_start_limit": {
                              "total": 1000, "remaining": 999, "reset_after": 0,
                              "max_concurrency": 1}})
        if method == "GET" and len(parts) == 2 and parts[0] == "users":
            user = self.users.get(parts[1])
            return json_response(user.payload()) if user else error(404, 10013, "Unknown User")
        if method == "POST" and tail == "users/@me/channels":
            user = self.users.get(str(body.get("recipient_id")))
            if user is None or user.id == self.bot.id:
                return error(400, 50033, "Invalid Recipient(s)")
            return json_response(self._channel(self.dm_channel_for(user)))
        if method == "GET" and len(parts) == 2 and parts[0] == "channels":
            ch = self._channel(parts[1])
            return json_response(ch) if ch else error(404, 10003, "Unknown Channel")
        if len(parts) == 3 and parts[0] == "channels" and parts[2] == "typing":
            if self._channel(parts[1]) is None:
                return error(404, 10003, "Unknown Channel")
            return web.Response(status=204)
        if method == "POST" and len(parts) == 3 and parts[0] == "channels" \
                and parts[2] == "messages":
            return await self._create_message(parts[1], body)
        if method == "GET" and len(parts) == 3 and parts[0] == "channels" \
                and parts[2] == "messages":
            return self._history(parts[1], request.query)
        if len(parts) == 7 and parts[0] == "channels" and parts[4] == "reactions" \
                and parts[6] == "@me" and method in ("PUT", "DELETE"):
            if parts[3] not in self.messages:
                return error(404, 10008, "Unknown Message")
            mine = self.bot_reactions.setdefault(parts[3], [])
            emoji = urllib.parse.unquote(parts[5])
            if method == "PUT" and emoji not in mine:
                mine.append(emoji)
            elif method == "DELETE" and emoji in mine:
                mine.remove(emoji)
            return web.Response(status=204)
        if len(parts) == 4 and parts[0] == "channels" and parts[2] == "messages" \
                and method in ("PATCH", "DELETE"):
            return self._change_message(method, parts[1], parts[3], body)
        action = await self._message_action(method, parts, body)
        return action if action is not None else error(404, 0, "404: Not Found")

@dataclass
class ThreadHandle:
    """A fake running on its own event loop in a daemon thread."""

    fake: FakeDiscord
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    @property
    def url(self) -> str:
        return self.fake.url

    @property
    def api_url(self) -> str:
        return self.fake.api_url

    @property
    def gateway_url(self) -> str:
        return self.fake.gateway_url

    def stop(self) -> None:
        """Stop the server and its loop; idempotent."""
        if not self.loop.is_closed() and self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self.fake.stop(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def start_in_thread(port: int = 0, **kwargs: Any) -> ThreadHandle:
    """Start a :class:`FakeDiscord` (``kwargs`` go to it) in a background thread; returns
    once it listens. Drive it through ``/_control/*`` (or ``handle.fake`` via
    ``asyncio.run_coroutine_threadsafe(..., handle.loop)``)."""
    fake = FakeDiscord(**kwargs)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    error: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(fake.start(port))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(exc)
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.close()

    thread = threading.Thread(target=run, name="fake-discord", daemon=True)
    thread.start()
    started.wait(10)
    if error:
        raise error[0]
    return ThreadHandle(fake, loop, thread)
