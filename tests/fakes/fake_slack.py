"""A fake Slack for tests: Web API, Socket Mode WebSocket and Events API push, on 127.0.0.1.

It speaks enough of the real protocols that the unmodified slack-sdk / slack-bolt clients
work against it (point ``AsyncWebClient(base_url=fake.api_url)`` at it; Socket Mode follows the
``ws://`` URL that ``apps.connections.open`` returns):

- Web API (https://docs.slack.dev/reference/methods): ``POST|GET /api/<method>``, token in
  ``Authorization: Bearer``, args as JSON, form or query; answers ``{"ok": ...}`` with HTTP 200
  (``invalid_auth`` included, as Slack does), 429 + ``Retry-After`` when rate limited.
  Implemented: auth.test, apps.connections.open, chat.postMessage, chat.update, users.info,
  reactions.add, pins.add, assistant.threads.setStatus; anything else answers ``unknown_method``.
- Socket Mode (https://docs.slack.dev/apis/events-api/using-socket-mode): single-use ticket
  URLs, ``hello`` on connect, ``events_api`` envelopes (``envelope_id``, ``retry_attempt``,
  ``retry_reason``), acks recorded, ``disconnect`` (refresh) on request.
- Slash commands (``push_command``): ``slash_commands`` envelopes or signed form POSTs,
  each with a ``response_url`` served here (tests/fakes/slack_responses.py: 5 posts in
  30 minutes, ephemeral by default; ``responses.of(url).posts`` shows what was posted).
- Events API over HTTP: events POSTed to a target URL with ``X-Slack-Signature`` (v0 HMAC-SHA256
  of ``v0:{timestamp}:{body}``), ``X-Slack-Request-Timestamp`` and, for retries,
  ``X-Slack-Retry-Num`` / ``X-Slack-Retry-Reason``.

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
``/redeliver`` (``envelope_id``), ``/command``, ``/raw``, ``/fail`` (FailRule fields),
``/outage`` (``on``, ``mode``, ``duration``), ``/disconnect``, ``/close_sockets``,
``/http_target`` (``url``: deliver events by signed POST there), ``/reset``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import parse_qsl, urlencode

import aiohttp
from aiohttp import web

try:
    from tests.fakes.slack_responses import ResponseUrls
except ImportError:  # run as a script
    from slack_responses import ResponseUrls  # type: ignore[no-redef]

WRITE_METHODS = {"chat.postMessage", "chat.update", "chat.delete", "reactions.add", "pins.add",
                 "reactions.remove", "chat.startStream", "chat.appendStream",
                 "chat.stopStream"}
DEFAULT_USERS = {
    "U0ALICE": {"name": "alice", "real_name": "Alice Liddell", "display_name": "alice"},
    "U0BOB": {"name": "bob", "real_name": "Bob Builder", "display_name": ""},
    "U0OTHERBOT": {"name": "otherbot", "real_name": "Other Bot", "display_name": "", "is_bot": True},
}


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 request signature: ``v0=`` + hex HMAC-SHA256 of ``v0:{ts}:{body}``."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def dm_channel_of(user_id: str) -> str:
    """The fake's IM channel id for a user (``U0ALICE`` -> ``D0ALICE``)."""
    return "D" + user_id[1:]


def channel_type_of(channel: str) -> str:
    """Slack's ``channel_type`` for an id prefix: C channel, G private/group, D im."""
    return {"C": "channel", "G": "group", "D": "im"}.get(channel[:1], "channel")


_DROP: Any = object()  # _injected's verdict: run the call, then drop the connection


@dataclass
class FailRule:
    """One injected failure for the next ``count`` matching calls.

    kind: ``ratelimited`` (429 + Retry-After), ``markup`` (ok:false ``error``, only for
    formatted sends: ``mrkdwn`` not false or ``blocks`` present), ``error`` (ok:false
    ``error``), ``5xx`` (``status`` with a text body), ``drop`` (the call succeeds, then
    the connection is closed before the response).
    """

    method: str = "chat.postMessage"
    kind: str = "ratelimited"
    count: int = 1
    retry_after: int = 1
    error: str = "ratelimited"
    status: int = 500


class FakeSlack:
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
    ) -> None:
        self.bot_token, self.app_token, self.signing_secret = bot_token, app_token, signing_secret
        self.team_id, self.app_id = team_id, app_id
        self.bot_user_id, self.bot_id, self.bot_name = bot_user_id, bot_id, bot_name
        self.echo_bot_messages = echo_bot_messages
        self.users = dict(DEFAULT_USERS if users is None else users)
        self.host, self.port = host, port
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
        self.responses = ResponseUrls()  # slash commands' response_url (slack_responses.py)

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

    # ----------------------------------------------------------------- event builders

    def next_ts(self) -> str:
        """A fresh Slack message timestamp (``"<epoch>.<6 digits>"``, unique)."""
        return f"{int(time.time())}.{next(self._ts):06d}"

    def message(self, text: str, *, user: str = "U0ALICE", channel: str = "C0GENERAL",
                ts: str | None = None, thread_ts: str | None = None,
                parent_user_id: str | None = None, **extra: Any) -> dict[str, Any]:
        """A ``message`` event as Slack sends it for message.channels/groups/im."""
        ts = ts or self.next_ts()
        ev: dict[str, Any] = {
            "type": "message", "user": user, "text": text, "ts": ts, "team": self.team_id,
            "channel": channel, "event_ts": ts, "channel_type": channel_type_of(channel),
            "client_msg_id": str(uuid.uuid4()),
        }
        if thread_ts:
            ev["thread_ts"] = thread_ts
            ev["parent_user_id"] = parent_user_id or user
        ev.update(extra)
        return ev

    def dm(self, text: str, *, user: str = "U0ALICE", **kw: Any) -> dict[str, Any]:
        """A message.im event from ``user`` in its IM channel with the bot."""
        return self.message(text, user=user, channel=dm_channel_of(user), **kw)

    def mention_text(self, text: str) -> str:
        return f"<@{self.bot_user_id}> {text}"

    def app_mention(self, text: str, *, user: str = "U0ALICE", channel: str = "C0GENERAL",
                    ts: str | None = None, thread_ts: str | None = None) -> dict[str, Any]:
        """An ``app_mention`` event (no channel_type field, as in Slack's payloads)."""
        ts = ts or self.next_ts()
        ev = {"type": "app_mention", "user": user, "text": text, "ts": ts,
              "team": self.team_id, "channel": channel, "event_ts": ts}
        if thread_ts:
            ev["thread_ts"] = thread_ts
        return ev

    def reaction(self, reaction: str, *, item_ts: str, channel: str = "C0GENERAL",
                 user: str = "U0ALICE", item_user: str | None = None) -> dict[str, Any]:
        """A ``reaction_added`` event on a message."""
        return {"type": "reaction_added", "user": user, "reaction": reaction,
                "item_user": item_user or self.bot_user_id,
                "item": {"type": "message", "channel": channel, "ts": item_ts},
                "event_ts": self.next_ts()}

    def edit(self, *, channel: str, ts: str, text: str, old_text: str = "",
             user: str = "U0ALICE", thread_ts: str | None = None) -> dict[str, Any]:
        """A ``message_changed`` event (hidden, the new message nested under ``message``)."""
        inner: dict[str, Any] = {"type": "message", "user": user, "text": text, "ts": ts,
                                 "edited": {"user": user, "ts": self.next_ts()}}
        prev: dict[str, Any] = {"type": "message", "user": user, "text": old_text, "ts": ts}
        if thread_ts:
            inner["thread_ts"] = prev["thread_ts"] = thread_ts
        now = self.next_ts()
        return {"type": "message", "subtype": "message_changed", "hidden": True,
                "channel": channel, "channel_type": channel_type_of(channel), "ts": now,
                "event_ts": now, "message": inner, "previous_message": prev}

    def delete(self, *, channel: str, ts: str, user: str = "U0ALICE") -> dict[str, Any]:
        """A ``message_deleted`` event."""
        now = self.next_ts()
        return {"type": "message", "subtype": "message_deleted", "hidden": True,
                "channel": channel, "channel_type": channel_type_of(channel), "ts": now,
                "deleted_ts": ts, "event_ts": now,
                "previous_message": {"type": "message", "user": user, "text": "", "ts": ts}}

    def build(self, kind: str, **kw: Any) -> dict[str, Any]:
        """Event by name, for the control endpoint: dm, message (channel), mention, thread
        (message with thread_ts), app_mention, reaction, edit, delete."""
        if kind == "dm":
            return self.dm(kw.pop("text"), **kw)
        if kind in ("message", "channel", "thread"):
            return self.message(kw.pop("text"), **kw)
        if kind == "mention":
            return self.message(self.mention_text(kw.pop("text")), **kw)
        if kind == "app_mention":
            return self.app_mention(kw.pop("text"), **kw)
        if kind == "reaction":
            return self.reaction(kw.pop("reaction"), **kw)
        if kind == "edit":
            return self.edit(**kw)
        if kind == "delete":
            return self.delete(**kw)
        raise ValueError(f"unknown event kind {kind!r}")

    # ----------------------------------------------------------------- event delivery

    def envelope(self, event: Any, *, event_id: str | None = None) -> dict[str, Any]:
        """Wrap an event into a Socket Mode ``events_api`` envelope (retry_attempt 0)."""
        payload = {
            "token": "fake-verification-token", "team_id": self.team_id,
            "api_app_id": self.app_id, "event": event, "type": "event_callback",
            "event_id": event_id or "Ev" + uuid.uuid4().hex[:10].upper(),
            "event_time": int(time.time()),
            "authorizations": [{"enterprise_id": None, "team_id": self.team_id,
                                "user_id": self.bot_user_id, "is_bot": True,
                                "is_enterprise_install": False}],
            "is_ext_shared_channel": False,
        }
        return {"envelope_id": str(uuid.uuid4()), "payload": payload, "type": "events_api",
                "accepts_response_payload": False, "retry_attempt": 0, "retry_reason": ""}

    async def push_event(self, event: Any, *, event_id: str | None = None) -> dict[str, Any]:
        """Deliver one event (socket if connected, else HTTP target, else queue until a
        socket connects). Returns the envelope (its ``payload.event_id`` identifies it)."""
        env = self.envelope(event, event_id=event_id)
        if isinstance(event, dict) and event.get("type") in ("message", "app_mention") \
                and not event.get("subtype") and event.get("channel"):
            self._remember(str(event["channel"]), event)
        await self._deliver(env)
        return env

    def _remember(self, channel: str, msg: dict[str, Any]) -> None:
        kept = self.history.setdefault(channel, [])
        if not any(m.get("ts") == msg.get("ts") for m in kept):  # message + app_mention
            kept.append({k: v for k, v in msg.items() if k not in ("channel", "channel_type",
                                                                   "event_ts")})

    async def push_command(self, command: str, text: str = "", *, user: str = "U0ALICE",
                           channel: str | None = None) -> dict[str, Any]:
        """Deliver a ``slash_commands`` envelope (socket) or form POST (HTTP target)."""
        channel = channel or dm_channel_of(user)
        payload = {
            "token": "fake-verification-token", "team_id": self.team_id,
            "team_domain": "fake", "channel_id": channel,
            "channel_name": "directmessage" if channel.startswith("D") else "general",
            "user_id": user, "user_name": self.users.get(user, {}).get("name", user.lower()),
            "command": command, "text": text, "api_app_id": self.app_id,
            "is_enterprise_install": "false", "trigger_id": uuid.uuid4().hex,
            "response_url": self.responses.new(self.url, user=user, channel=channel,
                                               command=command),
        }
        env = {"envelope_id": str(uuid.uuid4()), "payload": payload, "type": "slash_commands",
               "accepts_response_payload": True}
        await self._deliver(env)
        return env

    async def redeliver(self, envelope: dict[str, Any], reason: str = "timeout") -> dict[str, Any]:
        """Slack's retry: same payload and event_id, new envelope_id, retry_attempt + 1."""
        env = {**envelope, "envelope_id": str(uuid.uuid4()),
               "retry_attempt": int(envelope.get("retry_attempt") or 0) + 1,
               "retry_reason": reason}
        await self._deliver(env)
        return env

    async def push_raw(self, text: str) -> None:
        """Send an arbitrary text frame to every connected socket (malformed input tests)."""
        for ws in self._live_sockets():
            await ws.send_str(text)

    async def send_disconnect(self, reason: str = "refresh_requested") -> None:
        """Slack's ``disconnect`` message: the client should reconnect with a new URL."""
        msg = {"type": "disconnect", "reason": reason,
               "debug_info": {"host": "fake-slack"}}
        for ws in self._live_sockets():
            await ws.send_json(msg)

    async def close_sockets(self) -> None:
        """Drop every Socket Mode connection (the client sees a close frame)."""
        for ws in self._live_sockets():
            await ws.close(code=1001, message=b"fake-slack closing")

    def _live_sockets(self) -> list[web.WebSocketResponse]:
        self._sockets = [ws for ws in self._sockets if not ws.closed]
        return list(self._sockets)

    async def _deliver(self, env: dict[str, Any]) -> None:
        live = self._live_sockets()
        if live:
            self.envelopes.append(env)
            await live[-1].send_json(env)
        elif self.http_target:
            self.envelopes.append(env)
            await self._post_http(env)
        else:
            self._pending.append(env)

    async def _post_http(self, env: dict[str, Any]) -> None:
        assert self._session is not None
        if env["type"] == "slash_commands":
            body = urlencode(env["payload"]).encode()
            ctype = "application/x-www-form-urlencoded"
        else:
            body = json.dumps(env["payload"]).encode()
            ctype = "application/json"
        await self.post_signed(body, content_type=ctype, retry=env.get("retry_attempt") or 0,
                               reason=env.get("retry_reason") or "http_timeout")

    async def post_signed(self, body: bytes, *, content_type: str = "application/json",
                          retry: int = 0, reason: str = "http_timeout",
                          timestamp: str | None = None, secret: str | None = None) -> int:
        """POST ``body`` to ``http_target`` signed like Slack (or with another ``secret`` /
        ``timestamp`` to test rejection). Returns the HTTP status (0: no answer)."""
        assert self._session is not None and self.http_target
        ts = timestamp or str(int(time.time()))
        headers = {"Content-Type": content_type, "X-Slack-Request-Timestamp": ts,
                   "X-Slack-Signature": sign(secret or self.signing_secret, ts, body)}
        if retry:
            headers["X-Slack-Retry-Num"] = str(retry)
            headers["X-Slack-Retry-Reason"] = reason
        try:
            async with self._session.post(self.http_target, data=body, headers=headers) as r:
                self.http_responses.append(r.status)
                return r.status
        except aiohttp.ClientError:
            self.http_responses.append(0)
            return 0

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
                "chat.delete": self._chat_update, "reactions.remove": self._ok,
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

    def _open_dm(self, args: dict[str, Any]) -> web.Response:
        """conversations.open with ``users`` (one user): the DM channel's id."""
        return _ok({"channel": {"id": dm_channel_of(str(args.get("users", "")))}})

    def _history(self, args: dict[str, Any]) -> web.Response:
        """conversations.history: top-level messages of ``channel`` newer than ``oldest``,
        newest first, at most ``limit``."""
        channel = self._resolve_channel(str(args.get("channel", "")))
        oldest = float(args.get("oldest") or 0)
        msgs = [m for m in reversed(self.history.get(channel, []))
                if float(m["ts"]) > oldest and m.get("thread_ts") in (None, m["ts"])]
        return _ok({"messages": msgs[:int(args.get("limit") or 100)], "has_more": False})

    def _check_token(self, method: str, token: str | None) -> web.Response | None:
        if not token:
            return _err("not_authed")
        if method == "apps.connections.open":
            if token.startswith("xoxb-"):
                return _err("not_allowed_token_type")
            return None if token == self.app_token else _err("invalid_auth")
        if token.startswith("xapp-"):
            return _err("not_allowed_token_type")
        return None if token == self.bot_token else _err("invalid_auth")

    def _injected(self, method: str, args: dict[str, Any]) -> web.Response | None:
        for rule in self.rules:
            if rule.method != method or rule.count <= 0:
                continue
            if rule.kind == "markup" and not _formatted(args):
                continue
            rule.count -= 1
            if rule.kind == "ratelimited":
                resp = web.json_response({"ok": False, "error": "ratelimited"}, status=429,
                                         headers={"Retry-After": str(rule.retry_after)})
                return resp
            if rule.kind == "drop":
                return _DROP
            if rule.kind == "5xx":
                return web.Response(status=rule.status, text="fake-slack failure",
                                    content_type="text/plain")
            return _err(rule.error)
        return None

    def _auth_test(self, args: dict[str, Any]) -> web.Response:
        return _ok({"url": "https://fake-slack.example/", "team": "Fake Team",
                    "user": self.bot_name, "team_id": self.team_id,
                    "user_id": self.bot_user_id, "bot_id": self.bot_id,
                    "is_enterprise_install": False})

    def _connections_open(self, args: dict[str, Any]) -> web.Response:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        ws_url = self.url.replace("http://", "ws://", 1)
        return _ok({"url": f"{ws_url}/link/?ticket={ticket}&app_id={self.app_id}"})

    def _resolve_channel(self, channel: str) -> str:
        return dm_channel_of(channel) if channel.startswith(("U", "W")) else channel

    def _post_message(self, args: dict[str, Any]) -> web.Response:
        channel = str(args.get("channel") or "")
        if not channel:
            return _err("channel_not_found")
        if not args.get("text") and not args.get("blocks") and not args.get("attachments"):
            return _err("no_text")
        if len(str(args.get("text") or "")) > 40000:
            return _err("msg_too_long")
        channel = self._resolve_channel(channel)
        ts = self.next_ts()
        msg = {"type": "message", "user": self.bot_user_id, "bot_id": self.bot_id,
               "app_id": self.app_id, "text": args.get("text", ""), "ts": ts,
               "team": self.team_id}
        if args.get("thread_ts"):
            msg["thread_ts"] = str(args["thread_ts"])
        self._remember(channel, msg)
        return _ok({"channel": channel, "ts": ts, "message": msg})

    # chat.startStream / appendStream / stopStream
    # (https://docs.slack.dev/reference/methods/chat.startStream and its siblings):
    # ``channel`` required everywhere, ``ts`` for append/stop; ``markdown_text`` (at most
    # 12,000 characters a call) is appended to what the message shows so far and is
    # required by appendStream; outside a DM, startStream needs ``recipient_user_id`` and
    # ``recipient_team_id``; a stopped stream takes no more text.
    def _stream_message(self, args: dict[str, Any]) -> dict[str, Any] | web.Response:
        channel = self._resolve_channel(str(args.get("channel") or ""))
        if not channel or not args.get("ts"):
            return _err("invalid_arguments")
        msg = next((m for m in self.history.get(channel, []) if m["ts"] == str(args["ts"])),
                   None)
        if msg is None:
            return _err("message_not_found")
        if not self.streams.get(msg["ts"]):
            return _err("message_not_in_streaming_state")
        if len(str(args.get("markdown_text") or "")) > 12000:
            return _err("msg_too_long")
        return msg

    def _start_stream(self, args: dict[str, Any]) -> web.Response:
        channel = str(args.get("channel") or "")
        if not channel:
            return _err("channel_not_found")
        channel = self._resolve_channel(channel)
        if not channel.startswith("D") and not (args.get("recipient_user_id")
                                                and args.get("recipient_team_id")):
            return _err("invalid_arguments")
        if len(str(args.get("markdown_text") or "")) > 12000:
            return _err("msg_too_long")
        ts = self.next_ts()
        msg = {"type": "message", "user": self.bot_user_id, "bot_id": self.bot_id,
               "app_id": self.app_id, "text": str(args.get("markdown_text") or ""), "ts": ts,
               "team": self.team_id}
        if args.get("thread_ts"):
            msg["thread_ts"] = str(args["thread_ts"])
        self.history.setdefault(channel, []).append(msg)
        self.streams[ts] = True
        return _ok({"channel": channel, "ts": ts})

    def _append_stream(self, args: dict[str, Any]) -> web.Response:
        if not args.get("markdown_text"):
            return _err("invalid_arguments")
        msg = self._stream_message(args)
        if isinstance(msg, web.Response):
            return msg
        msg["text"] += str(args["markdown_text"])
        return _ok({"channel": self._resolve_channel(str(args["channel"])), "ts": msg["ts"]})

    def _stop_stream(self, args: dict[str, Any]) -> web.Response:
        msg = self._stream_message(args)
        if isinstance(msg, web.Response):
            return msg
        msg["text"] += str(args.get("markdown_text") or "")
        self.streams[msg["ts"]] = False
        return _ok({"channel": self._resolve_channel(str(args["channel"])), "ts": msg["ts"],
                    "message": dict(msg)})

    def streamed(self, channel: str) -> list[dict[str, Any]]:
        """Messages of ``channel`` made with chat.startStream: ``text`` so far,
        ``streaming`` (not stopped yet), ``thread_ts``."""
        return [{"ts": m["ts"], "text": m["text"], "thread_ts": m.get("thread_ts"),
                 "streaming": self.streams[m["ts"]]}
                for m in self.history.get(channel, []) if m["ts"] in self.streams]

    def _conversations_replies(self, args: dict[str, Any]) -> web.Response:
        """The thread of ``ts`` in ``channel``: the root, then its replies, oldest first,
        ``limit`` per page with an opaque ``cursor`` (as Slack pages them)."""
        channel, root = str(args.get("channel") or ""), str(args.get("ts") or "")
        msgs = self.history.get(channel)
        if msgs is None:
            return _err("channel_not_found")
        thread = sorted((m for m in msgs if m.get("ts") == root or m.get("thread_ts") == root),
                        key=lambda m: float(m["ts"]))
        if not thread:
            return _err("thread_not_found")
        start, limit = int(args.get("cursor") or 0), max(1, min(1000, int(args.get("limit")
                                                                          or 1000)))
        page = thread[start:start + limit]
        more = start + limit < len(thread)
        return _ok({"messages": page, "has_more": more,
                    "response_metadata": {"next_cursor": str(start + limit) if more else ""}})

    def _chat_update(self, args: dict[str, Any]) -> web.Response:
        if not args.get("channel") or not args.get("ts"):
            return _err("message_not_found")
        return _ok({"channel": self._resolve_channel(str(args["channel"])),
                    "ts": str(args["ts"]), "text": args.get("text", "")})

    def _users_info(self, args: dict[str, Any]) -> web.Response:
        uid = str(args.get("user") or "")
        u = self.users.get(uid)
        if u is None:
            return _err("user_not_found")
        return _ok({"user": {
            "id": uid, "team_id": self.team_id, "name": u["name"], "real_name": u["real_name"],
            "is_bot": bool(u.get("is_bot")), "deleted": False,
            "profile": {"real_name": u["real_name"], "display_name": u.get("display_name", "")},
        }})

    def _ok(self, args: dict[str, Any]) -> web.Response:
        return _ok({})

    # ----------------------------------------------------------------- files
    def add_file(self, name: str, data: bytes, mimetype: str,
                 size: int | None = None) -> dict[str, Any]:
        """A file object as message events carry it; downloadable from
        ``url_private_download`` with the bot token only. ``size`` overrides the
        announced size."""
        fid = f"F{len(self.files) + 1:07d}"
        self.files[fid] = data
        url = f"{self.url}/files-pri/{self.team_id}-{fid}/download/{name}"
        return {"id": fid, "name": name, "title": name, "mimetype": mimetype,
                "filetype": name.rsplit(".", 1)[-1], "size": len(data) if size is None
                else size, "mode": "hosted", "url_private": url,
                "url_private_download": url}

    async def _file_download(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        self.file_downloads.append({"path": request.path, "auth": auth})
        if auth != f"Bearer {self.bot_token}":
            # what Slack does without a valid token: a login page, not the file
            return web.Response(text="<html>sign in</html>", content_type="text/html")
        fid = request.match_info["tail"].split("/", 1)[0].split("-", 1)[-1]
        data = self.files.get(fid)
        return web.Response(body=data, content_type="application/octet-stream") \
            if data is not None else web.Response(status=404)

    def _get_upload_url(self, args: dict[str, Any]) -> web.Response:
        if not args.get("filename") or not str(args.get("length") or "").isdigit():
            return _err("invalid_arguments")
        fid = f"F{len(self.files) + len(self.pending_uploads) + 1:07d}U"
        self.pending_uploads[fid] = {"filename": args["filename"],
                                     "length": int(args["length"]), "data": None}
        return _ok({"upload_url": f"{self.url}/upload/{fid}", "file_id": fid})

    async def _file_upload(self, request: web.Request) -> web.Response:
        up = self.pending_uploads.get(request.match_info["file_id"])
        if up is None:
            return web.Response(status=404)
        up["data"] = await request.read()
        return web.Response(text="OK - " + str(len(up["data"])))

    def _complete_upload(self, args: dict[str, Any]) -> web.Response:
        files = args.get("files")
        if isinstance(files, str):
            files = json.loads(files)
        done = []
        for f in files or []:
            up = self.pending_uploads.pop(str(f.get("id")), None)
            if up is None or up["data"] is None:
                return _err("file_not_found")
            self.uploads.append({"channel": args.get("channel_id"),
                                 "thread_ts": args.get("thread_ts"),
                                 "filename": up["filename"], "data": up["data"]})
            done.append({"id": f["id"], "name": up["filename"], "title": f.get("title")})
        return _ok({"files": done})

    async def _echo(self, body: dict[str, Any]) -> None:
        # Slack delivers the bot's own posts back as message events; adapters must drop them.
        msg = dict(body["message"])
        channel = body["channel"]
        msg.update({"channel": channel, "channel_type": channel_type_of(channel),
                    "event_ts": msg["ts"]})
        await self.push_event(msg)

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            return web.Response(status=401, text="invalid or used ticket")
        self._tickets.discard(ticket)
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.append(ws)
        self.connections_opened += 1
        await ws.send_json({"type": "hello", "num_connections": self.connected_sockets,
                            "debug_info": {"host": "fake-slack", "build_number": 1,
                                           "approximate_connection_time": 18060},
                            "connection_info": {"app_id": self.app_id}})
        pending, self._pending = self._pending, []
        for env in pending:
            self.envelopes.append(env)
            await ws.send_json(env)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                try:
                    data = json.loads(msg.data)
                except ValueError:
                    continue
                if isinstance(data, dict) and "envelope_id" in data:
                    self.acks.append(data)
        return ws

    # ----------------------------------------------------------------- control endpoints

    async def _control_get(self, request: web.Request) -> web.Response:
        what = request.match_info["what"]
        data: Any = {
            "sent": self.sent, "calls": self.calls, "acks": self.acks,
            "envelopes": self.envelopes, "http_responses": self.http_responses,
            "state": {"connected_sockets": self.connected_sockets, "outage": self.outage,
                      "pending": len(self._pending), "url": self.url,
                      "connections_opened": self.connections_opened},
        }.get(what)
        if data is None:
            raise web.HTTPNotFound()
        return web.json_response(data)

    async def _control_post(self, request: web.Request) -> web.Response:
        what = request.match_info["what"]
        body = await request.json() if request.can_read_body else {}
        try:
            result = await self._control(what, body)
        except (ValueError, TypeError, KeyError) as exc:
            return web.json_response({"ok": False, "error": str(exc)}, status=400)
        return web.json_response({"ok": True, **(result or {})})

    async def _control(self, what: str, body: dict[str, Any]) -> dict[str, Any] | None:
        if what == "event":
            event = body["event"] if "event" in body else self.build(
                body.pop("kind"), **{k: v for k, v in body.items() if k != "event_id"})
            return {"envelope": await self.push_event(event, event_id=body.get("event_id"))}
        if what == "command":
            return {"envelope": await self.push_command(
                body["command"], body.get("text", ""), user=body.get("user", "U0ALICE"),
                channel=body.get("channel"))}
        if what == "redeliver":
            env = next(e for e in reversed(self.envelopes)
                       if e["envelope_id"] == body["envelope_id"])
            return {"envelope": await self.redeliver(env, body.get("reason", "timeout"))}
        if what == "raw":
            await self.push_raw(body["text"])
        elif what == "fail":
            self.fail_next(body.pop("method", "chat.postMessage"), **body)
        elif what == "outage":
            await self.set_outage(bool(body.get("on", True)), body.get("mode", "5xx"),
                                  body.get("duration"))
        elif what == "disconnect":
            await self.send_disconnect(body.get("reason", "refresh_requested"))
        elif what == "close_sockets":
            await self.close_sockets()
        elif what == "http_target":
            self.http_target = body.get("url")
        elif what == "reset":
            self.reset()
        else:
            raise ValueError(f"unknown control {what!r}")
        return None


def _formatted(args: dict[str, Any]) -> bool:
    return bool(args.get("blocks")) or str(args.get("mrkdwn", "true")).lower() != "false"


def _ok(data: dict[str, Any]) -> web.Response:
    body = {"ok": True, **data}
    resp = web.json_response(body)
    resp._fake_body = body  # type: ignore[attr-defined]
    return resp


def _err(error: str) -> web.Response:
    body = {"ok": False, "error": error}
    resp = web.json_response(body)
    resp._fake_body = body  # type: ignore[attr-defined]
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


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.fakes.fake_slack [--port N] [--bot-token T] [--app-token T]
    [--signing-secret S]``: prints ``READY <url>``, runs until SIGTERM/SIGINT."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description="Run the fake Slack standalone.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bot-token", default="xoxb-fake-bot-token")
    parser.add_argument("--app-token", default="xapp-fake-app-token")
    parser.add_argument("--signing-secret", default="fake-signing-secret")
    args = parser.parse_args(argv)

    async def serve() -> None:
        fake = await FakeSlack(host=args.host, port=args.port, bot_token=args.bot_token,
                               app_token=args.app_token,
                               signing_secret=args.signing_secret).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"READY {fake.url}", flush=True)
        await stop.wait()
        await fake.stop()

    asyncio.run(serve())


if __name__ == "__main__":  # pragma: no cover - manual/subprocess use
    main()
