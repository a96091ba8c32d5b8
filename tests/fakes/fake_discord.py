"""A fake Discord: REST API v10 and gateway WebSocket on 127.0.0.1, for tests.

Speaks enough of the real protocols that discord.py 2.x works against it unmodified
(point ``discord.http.Route.BASE`` at :attr:`FakeDiscord.api_url` and
``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY`` at :attr:`FakeDiscord.gateway_url`):

- Gateway (Discord developer docs, "events/gateway"): HELLO with
  ``heartbeat_interval``, HEARTBEAT -> HEARTBEAT_ACK, IDENTIFY -> READY + GUILD_CREATE
  (channels, threads, roles, the bot's member), RESUME -> RESUMED (or INVALID_SESSION),
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
  user runs a registered application command (tests/fakes/discord_interactions.py, which
  also serves command registration, interaction callbacks and webhook follow-ups)
- ``POST /_control/dispatch`` ``{"event", "data"}`` (anything, malformed included)
- ``POST /_control/fail`` ``{"kind": "429"|"markup"|"status", "count"?, "retry_after"?,
  "status"?, "global"?}``; ``POST /_control/outage`` ``{"down": bool, "mode"?: "503"|
  "refuse"}``; ``POST /_control/reset`` (clears ``sent``, gateway log, failures)
- ``GET /_control/sent`` -> ``{"sent": [...]}``; ``GET /_control/state`` -> connection
  counts, ids of the bot/guild/channels/users, gateway log.

``python tests/fakes/fake_discord.py [--port N]`` runs it standalone and prints
``{"url": ..., "api_url": ..., "gateway_url": ...}`` on stdout (SIGTERM stops it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import WSMsgType, web

try:
    from tests.fakes.discord_interactions import Interactions
except ImportError:  # run as a script: python tests/fakes/fake_discord.py
    from discord_interactions import Interactions  # type: ignore[no-redef]

DISCORD_EPOCH_MS = 1_420_070_400_000
MESSAGE_CONTENT_INTENT = 1 << 15
TEXT_LIMIT = 2000
ATTACHMENT_LIMIT = 10 * 1024 * 1024  # per request, for bots in servers without boosts
_PAYLOAD = web.RequestKey("payload", object)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # discord.py only parses JSON when the content type is exactly application/json.
    return web.Response(body=json.dumps(data).encode(), status=status, headers=headers,
                        content_type="application/json")


def _error(status: int, code: int, message: str, errors: dict | None = None) -> web.Response:
    body: dict[str, Any] = {"code": code, "message": message}
    if errors:
        body["errors"] = errors
    return _json(body, status)


@dataclass
class _Failure:
    kind: str  # "429" | "markup" | "status"
    remaining: int
    retry_after: float = 1.0
    status: int = 503
    is_global: bool = False


@dataclass(eq=False)
class _Conn:
    ws: web.WebSocketResponse
    session_id: str | None = None
    seq: int = 0
    intents: int = 0
    ready: bool = False


@dataclass
class FakeUser:
    id: str
    username: str
    global_name: str | None = None
    bot: bool = False

    def payload(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "username": self.username, "discriminator": "0",
                             "global_name": self.global_name, "avatar": None,
                             "public_flags": 0}
        if self.bot:
            d["bot"] = True
        return d


@dataclass
class FakeDiscord:
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
        self._conns: set[_Conn] = set()
        self._sessions: dict[str, int] = {}  # session id -> intents
        self._tasks: set[asyncio.Task] = set()
        self._failures: list[_Failure] = []
        self.nonce_replays = 0  # creates answered with an earlier message (enforce_nonce)
        self._outage: str | None = None  # None | "503" | "refuse"
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port = 0
        self.interactions = Interactions(self)  # application commands (discord_interactions)

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
            await conn.ws.close(code=code, message=b"fake closed")
        self._conns.clear()

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
        self._failures.append(_Failure(kind, count, retry_after, status, is_global))

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

    # ------------------------------------------------------------------ payload builders

    def _member(self, user: FakeUser) -> dict[str, Any]:
        roles = [self.bot_role_id] if user.id == self.bot.id else []
        return {"roles": roles, "nick": None, "joined_at": "2025-01-01T00:00:00+00:00",
                "deaf": False, "mute": False, "flags": 0, "pending": False}

    def _channel(self, cid: str) -> dict[str, Any] | None:
        if cid in (self.channel_id, self.other_channel_id):
            name = "general" if cid == self.channel_id else "random"
            return {"id": cid, "type": 0, "guild_id": self.guild_id, "name": name,
                    "position": 0 if cid == self.channel_id else 1,
                    "permission_overwrites": [], "parent_id": None, "nsfw": False,
                    "topic": None, "last_message_id": None, "rate_limit_per_user": 0,
                    "flags": 0}
        if cid == self.thread_id:
            return self._thread(cid, "help-thread")
        if cid in self._threads:
            return self._threads[cid]
        for uid, dm in self.dm_channels.items():
            if dm == cid:
                return {"id": dm, "type": 1, "last_message_id": None, "flags": 0,
                        "recipients": [self.users[uid].payload()]}
        return None

    def _thread(self, tid: str, name: str, parent_id: str | None = None) -> dict[str, Any]:
        return {"id": tid, "type": 11, "guild_id": self.guild_id,
                "parent_id": parent_id or self.channel_id, "owner_id": self.alice.id,
                "name": name, "last_message_id": None, "message_count": 1, "member_count": 2,
                "rate_limit_per_user": 0, "flags": 0, "total_message_sent": 1,
                "thread_metadata": {"archived": False, "auto_archive_duration": 1440,
                                    "archive_timestamp": _now_iso(), "locked": False,
                                    "create_timestamp": _now_iso()}}

    def guild_payload(self) -> dict[str, Any]:
        """The GUILD_CREATE payload: one guild, #general, #random, one thread, two roles."""
        return {
            "id": self.guild_id, "name": "Tide Test", "icon": None, "owner_id": self.alice.id,
            "unavailable": False, "large": False, "member_count": 4,
            "joined_at": "2025-01-01T00:00:00+00:00", "features": [], "afk_timeout": 300,
            "verification_level": 0, "default_message_notifications": 0,
            "explicit_content_filter": 0, "mfa_level": 0, "premium_tier": 0,
            "system_channel_id": self.channel_id, "preferred_locale": "en-US",
            "roles": [
                {"id": self.guild_id, "name": "@everyone", "permissions": "1071698660929",
                 "position": 0, "color": 0, "hoist": False, "managed": False,
                 "mentionable": False, "flags": 0},
                {"id": self.bot_role_id, "name": "tidebot", "permissions": "274877975552",
                 "position": 1, "color": 0, "hoist": False, "managed": True,
                 "mentionable": False, "flags": 0, "tags": {"bot_id": self.bot.id}},
            ],
            "emojis": [], "stickers": [],
            "channels": [self._channel(self.channel_id), self._channel(self.other_channel_id)],
            "threads": [self._channel(self.thread_id)],
            "members": [{**self._member(self.bot), "user": self.bot.payload()}],
            "presences": [], "voice_states": [], "stage_instances": [],
            "guild_scheduled_events": [], "soundboard_sounds": [],
        }

    def message_payload(self, text: str, *, author: FakeUser | None = None,
                        channel_id: str | None = None, guild: bool = True,
                        mentions: list[FakeUser] | None = None,
                        mention_roles: list[str] | None = None,
                        reply_to: dict[str, Any] | None = None,
                        message_id: str | None = None) -> dict[str, Any]:
        """A MESSAGE_CREATE ``d`` object (Discord's message object plus ``guild_id`` and
        ``member`` in guilds). ``reply_to`` is the referenced message object."""
        author = author or self.alice
        d: dict[str, Any] = {
            "id": message_id or self.new_id(), "channel_id": channel_id or self.channel_id,
            "author": author.payload(), "content": text, "timestamp": _now_iso(),
            "edited_timestamp": None, "tts": False, "mention_everyone": False,
            "mentions": [], "mention_roles": mention_roles or [], "attachments": [],
            "embeds": [], "pinned": False, "type": 0, "flags": 0, "components": [],
        }
        if guild:
            d["guild_id"] = self.guild_id
            d["member"] = self._member(author)
        for u in mentions or []:
            m = u.payload()
            if guild:
                m["member"] = self._member(u)
            d["mentions"].append(m)
        if reply_to is not None:
            d["type"] = 19
            d["message_reference"] = {"type": 0, "message_id": reply_to["id"],
                                      "channel_id": reply_to["channel_id"]}
            if guild:
                d["message_reference"]["guild_id"] = self.guild_id
            d["referenced_message"] = reply_to
        return d

    def dm_channel_for(self, user: FakeUser) -> str:
        """The DM channel id between the bot and ``user`` (created on first use)."""
        if user.id not in self.dm_channels:
            self.dm_channels[user.id] = self.new_id()
        return self.dm_channels[user.id]

    # ------------------------------------------------------------------ injection

    async def dispatch(self, event: str, data: Any) -> int:
        """Send one DISPATCH to every ready connection; returns how many got it."""
        if event == "MESSAGE_CREATE" and isinstance(data, dict) and "id" in data:
            self.messages[str(data["id"])] = data  # so replies can reference it
        n = 0
        for conn in list(self._conns):
            if not conn.ready or conn.ws.closed:
                continue
            d = self._filter_content(conn, event, data)
            conn.seq += 1
            frame = {"op": 0, "t": event, "s": conn.seq, "d": d}
            try:
                await conn.ws.send_str(json.dumps(frame))
                n += 1
            except ConnectionError:
                self._conns.discard(conn)
        return n

    def _filter_content(self, conn: _Conn, event: str, data: Any) -> Any:
        # Discord blanks content without the privileged intent, except DMs, the bot's own
        # messages and messages that mention the bot.
        if event not in ("MESSAGE_CREATE", "MESSAGE_UPDATE") or not isinstance(data, dict):
            return data
        if conn.intents & MESSAGE_CONTENT_INTENT or "guild_id" not in data:
            return data
        author = (data.get("author") or {}).get("id")
        mentioned = any(m.get("id") == self.bot.id for m in data.get("mentions") or [])
        if author == self.bot.id or mentioned:
            return data
        return {**data, "content": "", "embeds": [], "attachments": []}

    async def send_dm(self, text: str, *, user: FakeUser | None = None,
                      message_id: str | None = None) -> dict[str, Any]:
        """A user DMs the bot. Returns the payload dispatched."""
        user = user or self.alice
        d = self.message_payload(text, author=user, channel_id=self.dm_channel_for(user),
                                 guild=False, message_id=message_id)
        await self.dispatch("MESSAGE_CREATE", d)
        return d

    def attachment(self, channel_id: str, filename: str, data: bytes,
                   content_type: str | None = None) -> dict[str, Any]:
        """An attachment object whose ``url`` this fake serves (like Discord's CDN)."""
        aid = self.new_id()
        path = f"{channel_id}/{aid}/{filename}"
        self.files[path] = data
        return {"id": aid, "filename": filename, "size": len(data),
                "url": f"{self.url}/attachments/{path}",
                "proxy_url": f"{self.url}/attachments/{path}",
                **({"content_type": content_type} if content_type else {})}

    async def send_dm_files(self, text: str, files: list[tuple[str, bytes, str]], *,
                            user: FakeUser | None = None) -> dict[str, Any]:
        """A DM with attachments ``(filename, bytes, content_type)``."""
        user = user or self.alice
        cid = self.dm_channel_for(user)
        d = self.message_payload(text, author=user, channel_id=cid, guild=False)
        d["attachments"] = [self.attachment(cid, n, b, t) for n, b, t in files]
        await self.dispatch("MESSAGE_CREATE", d)
        return d

    async def _attachment_file(self, request: web.Request) -> web.StreamResponse:
        self.file_downloads.append(request.match_info["tail"])
        data = self.files.get(request.match_info["tail"])
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data, content_type="application/octet-stream")

    async def send_guild(self, text: str, *, user: FakeUser | None = None,
                         channel_id: str | None = None, mention: bool = False,
                         role_mention: bool = False, reply_to_bot: bool = False,
                         message_id: str | None = None) -> dict[str, Any]:
        """A message in a guild channel (or thread: pass ``channel_id=fake.thread_id``).
        ``mention`` prefixes ``<@BOTID>``; ``role_mention`` uses the bot's managed role;
        ``reply_to_bot`` makes it a reply to a bot message."""
        cid = channel_id or self.channel_id
        mentions, roles = [], []
        if mention:
            text, mentions = f"<@{self.bot.id}> {text}", [self.bot]
        if role_mention:
            text, roles = f"<@&{self.bot_role_id}> {text}", [self.bot_role_id]
        ref = None
        if reply_to_bot:
            ref = self.message_payload("an earlier bot answer", author=self.bot, channel_id=cid)
        d = self.message_payload(text, author=user, channel_id=cid, mentions=mentions,
                                 mention_roles=roles, reply_to=ref, message_id=message_id)
        await self.dispatch("MESSAGE_CREATE", d)
        return d

    async def create_thread(self, name: str, parent_id: str | None = None,
                            thread_id: str | None = None) -> str:
        """A new thread (THREAD_CREATE, newly_created); returns its id (``thread_id``: a
        thread started from a message has that message's id, as on Discord)."""
        tid = thread_id or self.new_id()
        t = {**self._thread(tid, name, parent_id), "newly_created": True}
        self._threads[tid] = self._thread(tid, name, parent_id)
        await self.dispatch("THREAD_CREATE", t)
        return tid

    async def react(self, message_id: str, emoji: str = "👍", *, user: FakeUser | None = None,
                    channel_id: str | None = None, guild: bool = True) -> dict[str, Any]:
        """MESSAGE_REACTION_ADD by ``user`` on ``message_id``."""
        user = user or self.alice
        d: dict[str, Any] = {"user_id": user.id, "message_id": message_id,
                             "channel_id": channel_id or self.channel_id,
                             "emoji": {"id": None, "name": emoji}, "burst": False,
                             "burst_colors": [], "type": 0}
        if guild:
            d["guild_id"] = self.guild_id
            d["member"] = {**self._member(user), "user": user.payload()}
        else:
            d["channel_id"] = channel_id or self.dm_channel_for(user)
        await self.dispatch("MESSAGE_REACTION_ADD", d)
        return d

    async def edit(self, original: dict[str, Any], new_text: str) -> dict[str, Any]:
        """MESSAGE_UPDATE of ``original`` (a payload returned by send_*) with new content."""
        d = {**original, "content": new_text, "edited_timestamp": _now_iso()}
        await self.dispatch("MESSAGE_UPDATE", d)
        return d

    async def delete(self, original: dict[str, Any]) -> None:
        """MESSAGE_DELETE of ``original``."""
        d = {"id": original["id"], "channel_id": original["channel_id"]}
        if "guild_id" in original:
            d["guild_id"] = original["guild_id"]
        await self.dispatch("MESSAGE_DELETE", d)

    # ------------------------------------------------------------------ gateway

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        if self._outage:
            return _error(503, 0, "Service Unavailable")
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        conn = _Conn(ws)
        self._conns.add(conn)
        await ws.send_str(json.dumps({"op": 10, "s": None, "t": None,
                                      "d": {"heartbeat_interval": self.heartbeat_interval_ms}}))
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    frame = json.loads(msg.data)
                except ValueError:
                    await ws.close(code=4002, message=b"Error while decoding payload.")
                    break
                await self._on_frame(conn, frame)
        finally:
            self._conns.discard(conn)
        return ws

    async def _on_frame(self, conn: _Conn, frame: dict[str, Any]) -> None:
        op, d = frame.get("op"), frame.get("d")
        logged = {"op": op, "d": {k: v for k, v in d.items() if k != "token"}
                  if isinstance(d, dict) else d}
        self.gateway_log.append(logged)
        if op == 1:
            await conn.ws.send_str(json.dumps({"op": 11, "s": None, "t": None, "d": None}))
        elif op == 2:
            if d.get("token") != self.token:
                await conn.ws.close(code=4004, message=b"Authentication failed.")
                return
            intents = int(d.get("intents") or 0)
            if intents & MESSAGE_CONTENT_INTENT and not self.privileged_intents:
                await conn.ws.close(code=4014, message=b"Disallowed intent(s).")
                return
            self.identify_count += 1
            conn.intents, conn.session_id, conn.ready = intents, uuid.uuid4().hex, True
            self._sessions[conn.session_id] = intents
            await self._send_dispatch(conn, "READY", {
                "v": 10, "user": {**self.bot.payload(), "verified": True, "flags": 0,
                                  "mfa_enabled": False},
                "guilds": [{"id": self.guild_id, "unavailable": True}],
                "session_id": conn.session_id, "session_type": "normal",
                "resume_gateway_url": self.gateway_url, "private_channels": [],
                "application": {"id": self.bot.id, "flags": 0}})
            await self._send_dispatch(conn, "GUILD_CREATE", self.guild_payload())
        elif op == 6:
            if d.get("token") != self.token:
                await conn.ws.close(code=4004, message=b"Authentication failed.")
                return
            if d.get("session_id") not in self._sessions:
                await conn.ws.send_str(json.dumps({"op": 9, "s": None, "t": None, "d": False}))
                return
            self.resume_count += 1
            conn.session_id, conn.seq, conn.ready = d["session_id"], int(d.get("seq") or 0), True
            conn.intents = self._sessions[conn.session_id]
            await self._send_dispatch(conn, "RESUMED", {})

    async def _send_dispatch(self, conn: _Conn, event: str, data: Any) -> None:
        conn.seq += 1
        await conn.ws.send_str(json.dumps({"op": 0, "t": event, "s": conn.seq, "d": data}))

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
        request[_PAYLOAD] = payload
        if self._outage:
            resp: web.StreamResponse = _error(503, 0, "Service Unavailable")
        elif request.headers.get("Authorization") != f"Bot {self.token}" \
                and not self.interactions.is_token_route(path):
            resp = _error(401, 0, "401: Unauthorized")
        else:
            resp = await handler(request)
        record["status"] = resp.status
        if getattr(resp, "_fake_drop", False) and request.transport is not None:
            record["dropped"] = True
            request.transport.close()  # accepted, but the answer never leaves
        return resp

    def _take_failure(self) -> _Failure | None:
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
        body = request.get(_PAYLOAD) or {}
        routed = await self.interactions.route(method, parts, request.get(_PAYLOAD),
                                               request.query)
        if routed is not None:
            return routed
        if method == "GET" and tail == "users/@me":
            return _json({**self.bot.payload(), "verified": True, "flags": 0,
                          "mfa_enabled": False, "locale": "en-US"})
        if method == "GET" and tail == "oauth2/applications/@me":
            return _json({"id": self.bot.id, "name": "tidebot", "icon": None,
                          "description": "", "bot_public": False,
                          "bot_require_code_grant": False, "owner": self.alice.payload(),
                          "verify_key": "00" * 32, "flags": 0, "team": None,
                          "summary": "", "rpc_origins": []})
        if method == "GET" and tail in ("gateway", "gateway/bot"):
            return _json({"url": self.gateway_url.removesuffix("/gateway") + "/gateway",
                          "shards": 1, "session_start_limit": {
                              "total": 1000, "remaining": 999, "reset_after": 0,
                              "max_concurrency": 1}})
        if method == "GET" and len(parts) == 2 and parts[0] == "users":
            user = self.users.get(parts[1])
            return _json(user.payload()) if user else _error(404, 10013, "Unknown User")
        if method == "POST" and tail == "users/@me/channels":
            user = self.users.get(str(body.get("recipient_id")))
            if user is None or user.id == self.bot.id:
                return _error(400, 50033, "Invalid Recipient(s)")
            return _json(self._channel(self.dm_channel_for(user)))
        if method == "GET" and len(parts) == 2 and parts[0] == "channels":
            ch = self._channel(parts[1])
            return _json(ch) if ch else _error(404, 10003, "Unknown Channel")
        if len(parts) == 3 and parts[0] == "channels" and parts[2] == "typing":
            if self._channel(parts[1]) is None:
                return _error(404, 10003, "Unknown Channel")
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
                return _error(404, 10008, "Unknown Message")
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
        return action if action is not None else _error(404, 0, "404: Not Found")

    def _history(self, channel_id: str, query: Any) -> web.Response:
        """``GET /channels/{id}/messages?after=&limit=``: newest first, as Discord."""
        if self._channel(channel_id) is None:
            return _error(404, 10003, "Unknown Channel")
        after = int(query.get("after") or 0)
        limit = max(1, min(100, int(query.get("limit") or 50)))
        rows = sorted((m for m in self.messages.values()
                       if str(m.get("channel_id")) == channel_id and int(m["id"]) > after),
                      key=lambda m: int(m["id"]))[:limit]
        return _json(list(reversed(rows)))

    async def _message_action(self, method: str, parts: list[str],
                              body: dict[str, Any]) -> web.Response | None:
        """Reactions, pins and threads: ``PUT .../messages/{mid}/reactions/{emoji}/@me``,
        ``PUT .../messages/pins/{mid}``, ``POST .../messages/{mid}/threads``,
        ``POST /channels/{id}/threads``."""
        if not parts or parts[0] != "channels" or len(parts) < 3:
            return None
        if self._channel(parts[1]) is None:
            return _error(404, 10003, "Unknown Channel")
        if method == "PUT" and len(parts) == 7 and parts[4] == "reactions" and parts[6] == "@me":
            return web.Response(status=204)
        if method == "PUT" and len(parts) == 5 and parts[2:4] == ["messages", "pins"]:
            return web.Response(status=204)
        if method == "POST" and parts[-1] == "threads" and len(parts) == 5:
            # From a message: the thread takes the message's id; one thread per message.
            started = self.messages.get(parts[3])
            if started is None or started.get("channel_id") != parts[1]:
                return _error(404, 10008, "Unknown Message")
            if self.refuse_threads:
                return _error(403, 50013, "Missing Permissions")
            if parts[3] in self._threads:
                return _error(400, 160004, "A thread has already been created for this "
                              "message")
            if not 1 <= len(str(body.get("name") or "")) <= 100:
                return _error(400, 50035, "Invalid Form Body")
            tid = await self.create_thread(str(body["name"]), parts[1], thread_id=parts[3])
            return _json(self._threads[tid], 201)
        if method == "POST" and parts[-1] == "threads" and len(parts) == 3:
            tid = await self.create_thread(str(body.get("name") or "thread"), parts[1])
            return _json(self._threads[tid], 201)
        return None

    async def _create_message(self, channel_id: str, body: dict[str, Any]) -> web.Response:
        failure = self._take_failure()
        if failure is not None and failure.kind == "429":
            return _json({"message": "You are being rate limited.",
                          "retry_after": failure.retry_after, "global": failure.is_global},
                         429, {"Via": "1.1 google", "Retry-After": str(int(failure.retry_after
                                                                          + 0.999)),
                               "X-RateLimit-Scope": "user"})
        if failure is not None and failure.kind == "markup":
            return _error(400, 50035, "Invalid Form Body", {"content": {"_errors": [
                {"code": "BASE_TYPE_BAD_FORMAT", "message": "Invalid content formatting."}]}})
        if failure is not None and failure.kind != "drop":
            return _error(failure.status, 0, f"{failure.status}: fake failure")
        resp = self._create_or_replay(channel_id, body)
        if failure is not None:
            resp._fake_drop = True  # type: ignore[attr-defined]
        return resp

    def _create_or_replay(self, channel_id: str, body: dict[str, Any]) -> web.Response:
        # enforce_nonce: a second create with the same nonce (same author, within minutes
        # on Discord) returns the first message instead of creating another.
        nonce = body.get("nonce")
        if nonce is not None and body.get("enforce_nonce"):
            for existing in self.messages.values():
                if existing.get("nonce") == str(nonce) and \
                        existing.get("channel_id") == channel_id:
                    self.nonce_replays += 1
                    out = dict(existing)
                    out.pop("member", None)
                    return _json(out)
        return self._new_message(channel_id, body)

    def _new_message(self, channel_id: str, body: dict[str, Any]) -> web.Response:
        channel = self._channel(channel_id)
        if channel is None:
            return _error(404, 10003, "Unknown Channel")
        content = body.get("content") or ""
        files = body.get("_files") or []
        if sum(len(f["data"]) for f in files) > ATTACHMENT_LIMIT:
            return _error(413, 40005, "Request entity too large")
        if not content and not body.get("embeds") and not files:
            return _error(400, 50006, "Cannot send an empty message")
        if len(content) > TEXT_LIMIT:
            return _error(400, 50035, "Invalid Form Body", {"content": {"_errors": [
                {"code": "BASE_TYPE_MAX_LENGTH",
                 "message": f"Must be {TEXT_LIMIT} or fewer in length."}]}})
        guild = channel.get("type") != 1
        ref = body.get("message_reference") or {}
        referenced = self.messages.get(str(ref.get("message_id"))) if ref else None
        msg = self.message_payload(content, author=self.bot, channel_id=channel_id, guild=guild,
                                   reply_to=referenced)
        msg["attachments"] = [self.attachment(channel_id, f["filename"], f["data"])
                              for f in files]
        if files:
            self.uploads.append({"channel_id": channel_id, "files": files})
        if ref and referenced is None:
            msg["message_reference"] = {"type": 0, "message_id": str(ref.get("message_id")),
                                        "channel_id": channel_id}
        if body.get("nonce") is not None:
            msg["nonce"] = str(body["nonce"])
        self.messages[msg["id"]] = msg
        if self.echo_own_messages:
            # Discord sends the bot its own messages; the adapter must drop them.
            task = asyncio.create_task(self.dispatch("MESSAGE_CREATE", msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        out = dict(msg)
        out.pop("member", None)
        return _json(out)

    def _change_message(self, method: str, channel_id: str, message_id: str,
                        body: dict[str, Any]) -> web.StreamResponse:
        failure = self._take_failure()
        if failure is not None and failure.kind == "429":
            return _json({"message": "You are being rate limited.",
                          "retry_after": failure.retry_after, "global": False}, 429,
                         {"Via": "1.1 google", "X-RateLimit-Scope": "user"})
        msg = self.messages.get(message_id)
        if msg is None or msg.get("channel_id") != channel_id:
            return _error(404, 10008, "Unknown Message")
        if msg["author"]["id"] != self.bot.id:
            return _error(403, 50005, "Cannot edit a message authored by another user")
        if method == "DELETE":
            del self.messages[message_id]
            return web.Response(status=204)
        content = body.get("content")
        if content is not None:
            if len(content) > TEXT_LIMIT:
                return _error(400, 50035, "Invalid Form Body")
            msg["content"] = content
            msg["edited_timestamp"] = _now_iso()
        out = dict(msg)
        out.pop("member", None)
        return _json(out)

    def chat_view(self, channel_id: str) -> list[str]:
        """What the channel shows now: the bot's messages after edits and deletions."""
        messages = list(self.messages.values())  # one C-level copy: safe from another thread
        return [m["content"] for m in messages
                if m.get("channel_id") == channel_id and m["author"]["id"] == self.bot.id]

    def edits(self, channel_id: str | None = None) -> list[dict[str, Any]]:
        """Successful message edits (PATCH) recorded, optionally for one channel."""
        return [s for s in self.sent if s["method"] == "PATCH" and s["status"] == 200
                and "/messages/" in s["path"]
                and channel_id in (None, s["path"].split("/")[2])]

    # ------------------------------------------------------------------ control API

    async def _control(self, request: web.Request) -> web.StreamResponse:
        action = request.match_info["action"]
        body: dict[str, Any] = {}
        if request.method == "POST" and request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                return _json({"error": "body must be JSON"}, 400)
        try:
            result = await self._control_action(request.method, action, body)
        except (KeyError, TypeError, ValueError) as exc:
            return _json({"error": f"{type(exc).__name__}: {exc}"}, 400)
        if result is None:
            return _json({"error": f"unknown control action {action!r}"}, 404)
        return _json(result)

    def _user(self, key: str | None) -> FakeUser:
        if not key:
            return self.alice
        for u in self.users.values():
            if key in (u.id, u.username):
                return u
        raise ValueError(f"unknown user {key!r}")

    async def _control_action(self, method: str, action: str, b: dict[str, Any]) -> Any:
        if method == "GET" and action == "sent":
            return {"sent": self.sent}
        if method == "GET" and action == "state":
            return {"connected": self.connected, "identify_count": self.identify_count,
                    "resume_count": self.resume_count, "bot_id": self.bot.id,
                    "guild_id": self.guild_id, "channel_id": self.channel_id,
                    "thread_id": self.thread_id, "bot_role_id": self.bot_role_id,
                    "users": {u.username: u.id for u in self.users.values()},
                    "outage": self._outage, "gateway_log": self.gateway_log,
                    "nonce_replays": self.nonce_replays}
        if method != "POST":
            return None
        if action == "dm":
            return await self.send_dm(b["text"], user=self._user(b.get("user")),
                                      message_id=b.get("message_id"))
        if action == "message":
            return await self.send_guild(
                b["text"], user=self._user(b.get("user")), channel_id=b.get("channel_id"),
                mention=bool(b.get("mention")), role_mention=bool(b.get("role_mention")),
                reply_to_bot=bool(b.get("reply_to_bot")), message_id=b.get("message_id"))
        if action == "command":
            record = await self.interactions.invoke(
                b["name"], b.get("value"), user=self._user(b.get("user")),
                channel_id=b.get("channel_id"), guild=b.get("guild", True))
            return {"interaction_id": record.id}
        if action == "dispatch":
            return {"delivered": await self.dispatch(b["event"], b["data"])}
        if action == "reaction":
            return await self.react(b["message_id"], b.get("emoji", "👍"),
                                    user=self._user(b.get("user")),
                                    channel_id=b.get("channel_id"),
                                    guild=b.get("guild", True))
        if action == "edit":
            return await self.edit(b.get("message") or self.messages[b["message_id"]],
                                   b["text"])
        if action == "delete":
            await self.delete(b.get("message") or self.messages[b["message_id"]])
            return {"ok": True}
        if action == "thread":
            return {"thread_id": await self.create_thread(b.get("name", "new thread"),
                                                          b.get("parent_id"))}
        if action == "fail":
            self.fail_next_sends(int(b.get("count", 1)), b.get("kind", "429"),
                                 retry_after=float(b.get("retry_after", 1.0)),
                                 status=int(b.get("status", 503)),
                                 is_global=bool(b.get("global", False)))
            return {"ok": True}
        if action == "outage":
            await self.set_outage(bool(b.get("down", True)), b.get("mode", "503"))
            return {"ok": True}
        if action == "reset":
            self.sent.clear()
            self.gateway_log.clear()
            self._failures.clear()
            return {"ok": True}
        return None


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


if __name__ == "__main__":  # pragma: no cover - manual / subprocess use
    import argparse
    import signal

    parser = argparse.ArgumentParser(description="Run the fake Discord server.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default="fake-discord-token")
    parser.add_argument("--no-privileged-intents", action="store_true")
    args = parser.parse_args()
    handle = start_in_thread(args.port, token=args.token,
                             privileged_intents=not args.no_privileged_intents)
    print(json.dumps({"url": handle.url, "api_url": handle.api_url,
                      "gateway_url": handle.gateway_url}), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    handle.stop()
