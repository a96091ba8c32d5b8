"""A fake Telegram Bot API server for tests (aiohttp on 127.0.0.1, ephemeral port).

It speaks enough of the real Bot API (Telegram Bot API reference) that
python-telegram-bot 22.x works against it unmodified: ``POST /bot<token>/<method>`` with
form, JSON or query parameters (method names are case-insensitive, as on the real server),
``{"ok": true, "result": ...}`` envelopes, error envelopes with ``error_code``,
``description`` and ``parameters.retry_after`` / ``migrate_to_chat_id``, long-polling
``getUpdates`` with offsets and ``allowed_updates`` (``message_reaction`` only when asked
for), 409 conflicts (webhook active, a competing poller), ``setWebhook`` delivery with the
``X-Telegram-Bot-Api-Secret-Token`` header, and HTML ``parse_mode`` validation with the real
"Bad Request: can't parse entities: ..." errors, inline keyboards (``reply_markup`` checked
as the Bot API documents it), button presses as ``callback_query`` updates
(``press_button``), ``answerCallbackQuery`` (once per query) and
``editMessageReplyMarkup``.

Use it in-process (``fake = FakeTelegram(); await fake.start(); ... await fake.stop()``),
in a background thread (``start_in_thread()``), or as a process
(``python tests/fakes/fake_telegram.py --port 0`` prints ``{"url": ...}``). Other processes
drive it through ``/_control/*`` (see ``_control_routes``).

Point PTB at it with ``base_url=f"{fake.url}/bot"`` (TESTING.md).
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

DEFAULT_TOKEN = "123456:TEST-fake-token"
# What Telegram sends when allowed_updates was never given (Bot API: getUpdates).
DEFAULT_ALLOWED = {"message", "edited_message", "channel_post", "edited_channel_post",
                   "callback_query", "inline_query", "my_chat_member", "business_message"}
_OPT_IN = {"message_reaction", "message_reaction_count", "chat_member"}
# Fields PTB sends as bare strings; everything else is JSON-encoded in the form body.
_STRING_FIELDS = {"text", "parse_mode", "action", "url", "secret_token", "caption",
                  "chat_id", "language_code", "ip_address"}
_UPLOADS = {"sendphoto": "photo", "senddocument": "document", "sendvoice": "voice"}
_HTML_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span",
              "tg-spoiler", "a", "code", "pre", "blockquote", "tg-emoji"}
_TAG_RE = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)((?:\s+[^<>]*?)?)\s*(/?)>")
_ENTITY_RE = re.compile(r"&(#[0-9]+|#x[0-9A-Fa-f]+|lt|gt|amp|quot);")
_MENTION_RE = re.compile(r"(?<![\w@])@[A-Za-z][A-Za-z0-9_]{3,31}\b")
_COMMAND_RE = re.compile(r"(?<![\w/])/[A-Za-z0-9_]{1,32}(?:@[A-Za-z][A-Za-z0-9_]{3,31})?")


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (what Telegram counts for limits and entity offsets)."""
    return len(text.encode("utf-16-le")) // 2



# BotCommandScope types (Bot API reference, "BotCommandScope")
_COMMAND_SCOPES = {"default", "all_private_chats", "all_group_chats",
                   "all_chat_administrators", "chat", "chat_administrators", "chat_member"}

class EntityParseError(ValueError):
    """HTML ``parse_mode`` text Telegram would reject (message is the description tail)."""


def parse_html(text: str) -> str:
    """Validate Telegram-HTML and return the plain text it renders to.

    Mirrors the Bot API rules (formatting options, HTML style): only the supported tags,
    properly nested and closed; ``&lt; &gt; &amp; &quot;`` and numeric entities are decoded,
    any other ``&`` stays literal. Raises EntityParseError("Unsupported start tag ...").
    """
    out: list[str] = []
    stack: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "&":
            m = _ENTITY_RE.match(text, i)
            if m:
                out.append(html.unescape(m.group(0)))
                i = m.end()
                continue
            out.append(ch)
            i += 1
            continue
        if ch != "<":
            out.append(ch)
            i += 1
            continue
        offset = len(text[:i].encode())
        m = _TAG_RE.match(text, i)
        if not m:
            raise EntityParseError(f"Unsupported start tag \"\" at byte offset {offset}")
        closing, name, _attrs, _self = m.group(1), m.group(2).lower(), m.group(3), m.group(4)
        if closing:
            if not stack:
                raise EntityParseError(f"Unexpected end tag at byte offset {offset}")
            if stack[-1] != name:
                raise EntityParseError(
                    f"Unmatched end tag at byte offset {offset}, expected \"</{stack[-1]}>\", "
                    f"found \"</{name}>\"")
            stack.pop()
        else:
            if name not in _HTML_TAGS:
                raise EntityParseError(
                    f"Unsupported start tag \"{name}\" at byte offset {offset}")
            stack.append(name)
        i = m.end()
    if stack:
        raise EntityParseError(f"Can't find end tag corresponding to start tag \"{stack[-1]}\"")
    return "".join(out)


def auto_entities(text: str, bot_username: str | None = None) -> list[dict[str, Any]]:
    """The ``mention`` / ``bot_command`` entities Telegram would attach (UTF-16 offsets)."""
    found: list[dict[str, Any]] = []
    for regex, kind in ((_MENTION_RE, "mention"), (_COMMAND_RE, "bot_command")):
        for m in regex.finditer(text):
            if kind == "bot_command" and m.start() != 0:
                continue  # Telegram only marks commands at the start of a message
            found.append({"type": kind, "offset": utf16_len(text[:m.start()]),
                          "length": utf16_len(m.group(0))})
    return sorted(found, key=lambda e: e["offset"])


@dataclass
class _Failure:
    method: str            # lower-case method name or "*"
    status: int
    count: int
    description: str
    retry_after: int | None = None
    migrate_to: int | None = None
    only_formatted: bool = False


@dataclass
class _PollState:
    waiter: asyncio.Future | None = None
    allowed: set[str] = field(default_factory=lambda: set(DEFAULT_ALLOWED))


class FakeTelegram:
    """The fake Bot API. ``sent`` lists every non-polling call the bot made (dicts with
    ``method``, ``path``, ``payload``, ``status``, ``time``), failed attempts included;
    ``calls`` lists every method name (getUpdates too); ``updates`` every injected update.
    ``bot_user`` is what getMe returns.
    """

    def __init__(self, token: str = DEFAULT_TOKEN, *, bot_id: int = 7_000_000_001,
                 bot_username: str = "tidegate_test_bot", host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.token = token
        self.host, self.port = host, port
        self.bot_user = {"id": bot_id, "is_bot": True, "first_name": "Tidegate",
                         "username": bot_username, "can_join_groups": True,
                         "can_read_all_group_messages": False,
                         "supports_inline_queries": False}
        self.sent: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []  # every update ever injected
        self.calls: list[str] = []
        self.commands: list[dict[str, Any]] | None = None  # the default scope's menu
        self.commands_by_scope: dict[str, list[dict[str, Any]]] = {}  # scope type -> menu
        self.webhook: dict[str, Any] | None = None
        self.webhook_deliveries: list[dict[str, Any]] = []
        self.chats: dict[int, dict[str, Any]] = {}
        self.messages: dict[tuple[int, int], dict[str, Any]] = {}
        self.topics: dict[tuple[int, int], dict[str, Any]] = {}
        self.drafts: dict[tuple[int, int], str] = {}  # (chat, draft_id) -> latest text
        self.reactions: dict[tuple[Any, Any], list[str]] = {}  # (chat, message) -> emoji
        self.outage_mode: str | None = None
        self.files: dict[str, tuple[bytes, str]] = {}  # file_id -> (bytes, file_path)
        self.file_downloads: list[str] = []
        self.held_files: set[str] = set()  # file paths whose download waits until removed
        self._pending: list[dict[str, Any]] = []
        self._redeliver: list[dict[str, Any]] = []
        self._next_update_id = 500_000
        self._next_callback = 0
        self.callback_queries: dict[str, dict[str, Any] | None] = {}  # id -> the answer
        self.keyboard_messages: list[tuple[int, int]] = []  # (chat, message) sent with one
        self._next_msg_id: dict[int, int] = {}
        self._failures: list[_Failure] = []
        self._drops: dict[str, int] = {}
        self._poll = _PollState()
        # getUpdates calls that began while another client's poll was still open (two
        # pollers on one token at once: the real API answers the older one 409)
        self.poll_overlaps: list[dict[str, Any]] = []
        self._polls: dict[int, web.Request] = {}  # getUpdates calls in flight, by id()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._tasks: set[asyncio.Task] = set()
        self.url = ""

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> FakeTelegram:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._api)
        app.router.add_route("*", "/file/bot{token}/{path:.*}", self._file)
        app.add_routes(self._control_routes())
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, handle_signals=False)
        await self._runner.setup()
        await self._listen()
        return self

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await self._site.start()
        sock = self._site._server.sockets[0]  # type: ignore[union-attr]
        self.port = sock.getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        self._wake("shutdown")
        for task in list(self._tasks):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ----------------------------------------------------------------- failure injection
    def fail(self, method: str = "sendMessage", *, status: int = 500, count: int = 1,
             description: str | None = None, retry_after: int | None = None,
             migrate_to: int | None = None, only_formatted: bool = False) -> None:
        """Make the next ``count`` calls of ``method`` ("*" = any) fail with ``status``."""
        desc = description or {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
                               429: f"Too Many Requests: retry after {retry_after}",
                               }.get(status, "Internal Server Error")
        self._failures.append(_Failure(method.lower(), status, count, desc, retry_after,
                                       migrate_to, only_formatted))

    def drop_after_accept(self, method: str = "sendMessage", count: int = 1) -> None:
        """The next ``count`` calls of ``method`` succeed (a sent message is stored), then
        the connection is closed before the response: the bot cannot know it arrived."""
        self._drops[method.lower()] = self._drops.get(method.lower(), 0) + count

    def rate_limit(self, count: int = 1, retry_after: int = 1,
                   method: str = "sendMessage") -> None:
        """429 with ``parameters.retry_after`` (seconds) on the next ``count`` calls."""
        self.fail(method, status=429, count=count, retry_after=retry_after)

    def reject_markup(self, count: int = 1) -> None:
        """The next ``count`` sendMessage calls WITH a parse_mode fail with the real 400."""
        self.fail("sendMessage", status=400, count=count, only_formatted=True,
                  description="Bad Request: can't parse entities: Unsupported start tag "
                              "\"foo\" at byte offset 0")

    async def outage(self, mode: str = "5xx", duration: float | None = None) -> None:
        """Start an outage: ``5xx`` answers every API call 502 Bad Gateway; ``refuse`` stops
        listening and drops open connections (connection refused). ``duration`` (seconds)
        ends it automatically."""
        if mode not in ("5xx", "refuse"):
            raise ValueError("mode must be '5xx' or 'refuse'")
        self.outage_mode = mode
        if mode == "refuse" and self._site is not None and self._runner is not None:
            await self._site.stop()
            self._site = None
            for conn in list(self._runner.server.connections if self._runner.server else []):
                if conn.transport is not None:
                    conn.transport.abort()
            self._wake("shutdown")
        if duration:
            self._spawn(self._recover_later(duration))

    async def _recover_later(self, duration: float) -> None:
        await asyncio.sleep(duration)
        await self.recover()

    async def recover(self) -> None:
        """End an outage (listening again on the same port after ``refuse``)."""
        if self.outage_mode == "refuse" and self._site is None:
            await self._listen()
        self.outage_mode = None

    # ----------------------------------------------------------------- inbound injection
    def user(self, user_id: int, first_name: str = "Alice", username: str | None = None,
             *, is_bot: bool = False, last_name: str | None = None) -> dict[str, Any]:
        u: dict[str, Any] = {"id": user_id, "is_bot": is_bot, "first_name": first_name}
        if last_name:
            u["last_name"] = last_name
        if username:
            u["username"] = username
        return u

    def chat(self, chat_id: int, chat_type: str | None = None, *, title: str | None = None,
             is_forum: bool = False, user: dict[str, Any] | None = None) -> dict[str, Any]:
        """Register (or fetch) a chat: private when ``chat_id`` > 0, else supergroup."""
        if chat_id in self.chats and chat_type is None:
            return self.chats[chat_id]
        chat_type = chat_type or ("private" if chat_id > 0 else "supergroup")
        c: dict[str, Any] = {"id": chat_id, "type": chat_type}
        if chat_type == "private":
            u = user or {"first_name": "Alice"}
            c.update({k: u[k] for k in ("first_name", "last_name", "username") if k in u})
        else:
            c["title"] = title or f"Group {chat_id}"
        if is_forum:
            c["is_forum"] = True
        self.chats[chat_id] = c
        return c

    def create_topic(self, chat_id: int, name: str = "Topic",
                     creator: dict[str, Any] | None = None, thread_id: int | None = None) -> int:
        """Create a forum topic; returns its ``message_thread_id`` (the id of the
        ``forum_topic_created`` service message). ``creator`` defaults to the bot (as if it
        called createForumTopic)."""
        chat = self.chat(chat_id, "supergroup", is_forum=True)
        mid = thread_id if thread_id is not None else self._new_message_id(chat_id)
        root = {"message_id": mid, "from": creator or self.bot_user, "chat": chat,
                "date": int(time.time()), "message_thread_id": mid,
                "forum_topic_created": {"name": name, "icon_color": 7322096}}
        self.messages[(chat_id, mid)] = root
        self.topics[(chat_id, mid)] = root
        return mid

    def inject_message(self, text: str, *, chat_id: int, user_id: int,
                       first_name: str = "Alice", username: str | None = None,
                       is_bot: bool = False, chat_type: str | None = None,
                       thread_id: int | None = None, reply_to_message_id: int | None = None,
                       entities: list[dict[str, Any]] | None = None,
                       sender: dict[str, Any] | None = None,
                       kind: str = "message") -> dict[str, Any]:
        """Queue a user message (``kind`` message | channel_post) and return the update.

        Mentions (``@name``) and a leading ``/command`` get entities automatically;
        ``thread_id`` puts it in a forum topic (created on the fly by the sender);
        ``reply_to_message_id`` embeds that stored message (e.g. one the bot sent).
        """
        sender = sender or self.user(user_id, first_name, username, is_bot=is_bot)
        chat = self.chat(chat_id, chat_type, user=sender,
                         is_forum=thread_id is not None)
        if thread_id is not None and (chat_id, thread_id) not in self.topics:
            self.create_topic(chat_id, creator=sender, thread_id=thread_id)
        msg: dict[str, Any] = {"message_id": self._new_message_id(chat_id), "from": sender,
                               "chat": chat, "date": int(time.time()), "text": text}
        ents = entities if entities is not None else auto_entities(text)
        if ents:
            msg["entities"] = ents
        if thread_id is not None:
            msg["message_thread_id"] = thread_id
            msg["is_topic_message"] = True
            msg["reply_to_message"] = self.topics[(chat_id, thread_id)]
        if reply_to_message_id is not None:
            target = self.messages.get((chat_id, reply_to_message_id))
            msg["reply_to_message"] = target or {"message_id": reply_to_message_id,
                                                 "chat": chat, "date": int(time.time())}
        self.messages[(chat_id, msg["message_id"])] = msg
        return self.inject_update({kind: msg})

    def inject_edit(self, chat_id: int, message_id: int, new_text: str) -> dict[str, Any]:
        """Queue an ``edited_message`` for a stored message."""
        msg = dict(self.messages[(chat_id, message_id)])
        msg.update(text=new_text, edit_date=int(time.time()), entities=auto_entities(new_text))
        self.messages[(chat_id, message_id)] = msg
        return self.inject_update({"edited_message": msg})

    def inject_reaction(self, chat_id: int, message_id: int, user_id: int,
                        new: list[str] | tuple[str, ...] = ("👍",),
                        old: list[str] | tuple[str, ...] = (),
                        first_name: str = "Alice") -> dict[str, Any]:
        """Queue a ``message_reaction`` update (delivered only if allowed_updates asks)."""
        return self.inject_update({"message_reaction": {
            "chat": self.chat(chat_id), "message_id": message_id,
            "user": self.user(user_id, first_name), "date": int(time.time()),
            "old_reaction": [{"type": "emoji", "emoji": e} for e in old],
            "new_reaction": [{"type": "emoji", "emoji": e} for e in new]}})

    def inject_update(self, update: dict[str, Any]) -> dict[str, Any]:
        """Queue a raw update (``update_id`` assigned when missing) — malformed ones too."""
        if "update_id" not in update:
            self._next_update_id += 1
            update = {"update_id": self._next_update_id, **update}
        self.updates.append(update)
        self._pending.append(update)
        self._deliver_new([update])
        return update

    def redeliver(self, update: dict[str, Any]) -> None:
        """Deliver an update again, byte for byte (as after an unconfirmed offset or a
        failed webhook delivery)."""
        self._redeliver.append(update)
        self._deliver_new([update])

    def bot_messages(self, chat_id: int | None = None) -> list[dict[str, Any]]:
        """Payloads of the sendMessage calls that succeeded (optionally for one chat)."""
        return [s["payload"] for s in self.sent
                if s["method"].lower() == "sendmessage" and s["status"] == 200
                and (chat_id is None or str(s["payload"].get("chat_id")) == str(chat_id))]

    # ----------------------------------------------------------------- internals
    def _new_message_id(self, chat_id: int) -> int:
        self._next_msg_id[chat_id] = self._next_msg_id.get(chat_id, 0) + 1
        return self._next_msg_id[chat_id]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wake(self, why: str) -> None:
        waiter = self._poll.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(why)

    def _deliver_new(self, updates: list[dict[str, Any]]) -> None:
        if self.webhook:
            for u in updates:
                self._spawn(self._post_webhook(u))
        else:
            self._wake("new")

    async def _post_webhook(self, update: dict[str, Any], attempts: int = 3) -> None:
        assert self.webhook is not None
        headers = {"Content-Type": "application/json"}
        if self.webhook.get("secret_token"):
            headers["X-Telegram-Bot-Api-Secret-Token"] = self.webhook["secret_token"]
        for _ in range(attempts):
            status: int | str
            try:
                async with ClientSession(timeout=ClientTimeout(total=10)) as s, \
                        s.post(self.webhook["url"], data=json.dumps(update),
                               headers=headers) as r:
                    status = r.status
            except Exception as exc:  # noqa: BLE001 - recorded for the test
                status = repr(exc)
            self.webhook_deliveries.append({"update_id": update.get("update_id"),
                                            "status": status})
            if status != 200 and self.webhook is not None:  # getWebhookInfo reports it
                self.webhook["last_error"] = (int(time.time()), (
                    f"Wrong response from the webhook: {status}" if isinstance(status, int)
                    else "Connection refused"))
            if status == 200:
                if update in self._pending:
                    self._pending.remove(update)
                return
            await asyncio.sleep(0.2)

    @staticmethod
    def _update_kind(update: dict[str, Any]) -> str:
        return next((k for k in update if k != "update_id"), "")

    async def _params(self, request: web.Request) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query)
        if request.can_read_body:
            if request.content_type == "application/json":
                params.update(await request.json())
            else:
                params.update(await request.post())
        out: dict[str, Any] = {}
        for key, value in params.items():
            if isinstance(value, web.FileField):  # a multipart upload (sendPhoto, ...)
                out[key] = {"filename": value.filename, "content_type": value.content_type,
                            "data": value.file.read()}
                continue
            if isinstance(value, str) and key not in _STRING_FIELDS:
                try:
                    value = json.loads(value)
                except ValueError:
                    pass
            if key == "chat_id" and isinstance(value, str) and re.fullmatch(r"-?\d+", value):
                value = int(value)
            out[key] = value
        return out

    @staticmethod
    def _error(status: int, description: str, **parameters: Any) -> web.Response:
        body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
        params = {k: v for k, v in parameters.items() if v is not None}
        if params:
            body["parameters"] = params
        return web.json_response(body, status=status)

    @staticmethod
    def _ok(result: Any) -> web.Response:
        return web.json_response({"ok": True, "result": result})

    def _take_failure(self, method: str, params: dict[str, Any]) -> _Failure | None:
        for f in self._failures:
            if f.count > 0 and f.method in (method, "*"):
                if f.only_formatted and not params.get("parse_mode"):
                    continue
                f.count -= 1
                if f.count == 0:
                    self._failures.remove(f)
                return f
        return None

    async def _file(self, request: web.Request) -> web.Response:
        """File downloads (``/file/bot<token>/<file_path>``), as getFile announced them."""
        self.file_downloads.append(request.match_info["path"])
        while request.match_info["path"] in self.held_files:  # a slow download
            await asyncio.sleep(0.05)
        if request.match_info["token"] != self.token:
            return self._error(401, "Unauthorized")
        for data, path in self.files.values():
            if path == request.match_info["path"]:
                return web.Response(body=data, content_type="application/octet-stream")
        return self._error(404, "Not Found")

    # ----------------------------------------------------------------- media
    def add_file(self, data: bytes, path: str) -> dict[str, Any]:
        """Store a file the bot can fetch with getFile; returns its file_id/unique_id/size."""
        n = len(self.files) + 1
        file_id = f"FILE{n:04d}{'x' * 20}"
        self.files[file_id] = (data, path)
        return {"file_id": file_id, "file_unique_id": f"U{n:04d}", "file_size": len(data)}

    def inject_media(self, kind: str, data: bytes, *, chat_id: int, user_id: int,
                     caption: str | None = None, media_group_id: str | None = None,
                     file_name: str | None = None, mime_type: str | None = None,
                     announced_size: int | None = None, **extra: Any) -> dict[str, Any]:
        """Queue a message carrying a file: ``kind`` photo | document | voice | audio |
        video_note | sticker. ``announced_size`` overrides the file_size Telegram reports
        (e.g. to test the cap during download)."""
        info = self.add_file(data, f"{kind}s/file_{len(self.files) + 1}")
        if announced_size is not None:
            info["file_size"] = announced_size
        if kind == "photo":  # several sizes, the largest last (as Telegram sends them)
            thumb = {**self.add_file(data[:64], "photos/thumb"), "width": 90, "height": 67}
            payload: Any = [thumb, {**info, "width": 1280, "height": 960}]
        else:
            payload = dict(info)
            if file_name:
                payload["file_name"] = file_name
            if mime_type:
                payload["mime_type"] = mime_type
            if kind in ("voice", "audio", "video_note"):
                payload["duration"] = 3
            if kind == "video_note":
                payload["length"] = 240
            if kind == "sticker":
                payload.update(type="regular", width=512, height=512, is_animated=False,
                               is_video=False)
        sender = self.user(user_id)
        msg: dict[str, Any] = {"message_id": self._new_message_id(chat_id), "from": sender,
                               "chat": self.chat(chat_id, user=sender),
                               "date": int(time.time()), kind: payload, **extra}
        if caption:
            msg["caption"] = caption
        if media_group_id:
            msg["media_group_id"] = media_group_id
        self.messages[(chat_id, msg["message_id"])] = msg
        return self.inject_update({"message": msg})

    def uploads(self, method: str | None = None) -> list[dict[str, Any]]:
        """Successful sendPhoto/sendDocument/sendVoice calls: ``method``, ``chat_id``,
        ``filename``, ``data`` (the uploaded bytes)."""
        out = []
        for s in self.sent:
            low = s["method"].lower()
            if low in _UPLOADS and s["status"] == 200 and (method is None
                                                            or low == method.lower()):
                field = _UPLOADS[low]
                up = s["payload"].get(field) or {}
                out.append({"method": s["method"], "chat_id": s["payload"].get("chat_id"),
                            "filename": up.get("filename"), "data": up.get("data")})
        return out

    async def _m_getfile(self, p: dict[str, Any]) -> web.Response:
        entry = self.files.get(str(p.get("file_id")))
        if entry is None:
            return self._error(400, "Bad Request: invalid file_id")
        data, path = entry
        if len(data) > 20 * 1024 * 1024:  # the Bot API's download limit
            return self._error(400, "Bad Request: file is too big")
        return self._ok({"file_id": p["file_id"], "file_unique_id": "U" + p["file_id"][4:8],
                         "file_size": len(data), "file_path": path})

    async def _upload(self, p: dict[str, Any], field: str) -> web.Response:
        chat_id = p.get("chat_id")
        up = p.get(field)
        if not isinstance(chat_id, int):
            return self._error(400, "Bad Request: chat not found")
        if not isinstance(up, dict) or not up.get("data"):
            return self._error(400, f"Bad Request: there is no {field} in the request")
        limit = 10 * 1024 * 1024 if field == "photo" else 50 * 1024 * 1024
        if len(up["data"]) > limit:
            return self._error(413, "Request Entity Too Large")
        info = self.add_file(up["data"], f"sent/{up.get('filename')}")
        content: Any = [{**info, "width": 100, "height": 100}] if field == "photo" else \
            {**info, "file_name": up.get("filename"), **({"duration": 1} if field == "voice"
                                                          else {})}
        msg = {"message_id": self._new_message_id(chat_id), "from": self.bot_user,
               "chat": self.chat(chat_id), "date": int(time.time()), field: content}
        self.messages[(chat_id, msg["message_id"])] = msg
        return self._ok(msg)

    async def _m_sendphoto(self, p: dict[str, Any]) -> web.Response:
        return await self._upload(p, "photo")

    async def _m_senddocument(self, p: dict[str, Any]) -> web.Response:
        return await self._upload(p, "document")

    async def _m_sendvoice(self, p: dict[str, Any]) -> web.Response:
        return await self._upload(p, "voice")

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        low = method.lower()
        self.calls.append(method)
        if low == "getupdates":
            return await self._tracked_poll(request, method)
        return await self._call(request, method, low)

    async def _tracked_poll(self, request: web.Request, method: str) -> web.Response:
        """getUpdates, noting an overlap with another client's open poll (a client that
        went away — cancelled, killed — has a closing transport and does not count)."""
        others = [r for r in self._polls.values() if r.transport is not None
                  and not r.transport.is_closing() and r.transport is not request.transport]
        if others:
            self.poll_overlaps.append({"time": time.time(), "open": len(others)})
        self._polls[id(request)] = request
        try:
            return await self._call(request, method, "getupdates")
        finally:
            self._polls.pop(id(request), None)

    async def _call(self, request: web.Request, method: str, low: str) -> web.Response:
        if self.outage_mode == "5xx":
            return web.Response(status=502, text="<html><body>502 Bad Gateway</body></html>",
                                content_type="text/html")
        if request.match_info["token"] != self.token:
            return self._error(401, "Unauthorized")
        try:
            params = await self._params(request)
        except Exception:  # noqa: BLE001 - the real API answers 400 too
            return self._error(400, "Bad Request: invalid request body")
        record = {"method": method, "path": request.path, "payload": params,
                  "time": time.time(), "status": 200}
        if low != "getupdates":
            self.sent.append(record)
        failure = self._take_failure(low, params)
        if failure is not None:
            record["status"] = failure.status
            return self._error(failure.status, failure.description,
                               retry_after=failure.retry_after,
                               migrate_to_chat_id=failure.migrate_to)
        handler = getattr(self, f"_m_{low}", None)
        if handler is None:
            record["status"] = 404
            return self._error(404, "Not Found")
        response = await handler(params)
        record["status"] = response.status
        if self._drops.get(low, 0) > 0 and request.transport is not None:
            self._drops[low] -= 1
            record["dropped"] = True
            request.transport.close()  # accepted, but the answer never leaves
        return response

    # ----------------------------------------------------------------- API methods
    async def _m_getme(self, p: dict[str, Any]) -> web.Response:
        return self._ok(self.bot_user)

    async def _m_logout(self, p: dict[str, Any]) -> web.Response:
        return self._ok(True)

    async def _m_getupdates(self, p: dict[str, Any]) -> web.Response:
        if self.webhook:
            return self._error(409, "Conflict: can't use getUpdates method while webhook is "
                                    "active; use deleteWebhook to delete the webhook first")
        if p.get("allowed_updates"):
            self._poll.allowed = set(p["allowed_updates"])
        elif p.get("allowed_updates") == []:
            self._poll.allowed = set(DEFAULT_ALLOWED)
        self._wake("conflict")  # a newer poll terminates the older one, as on Telegram
        offset, timeout = int(p.get("offset") or 0), float(p.get("timeout") or 0)
        limit = max(1, min(int(p.get("limit") or 100), 100))
        ready = self._ready(offset)
        if not ready and timeout > 0:
            waiter = asyncio.get_running_loop().create_future()
            self._poll.waiter = waiter
            try:
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
            except TimeoutError:
                pass
            if waiter.done() and waiter.result() == "conflict":
                return self._error(409, "Conflict: terminated by other getUpdates request; "
                                        "make sure that only one bot instance is running")
            if self.outage_mode:
                return web.Response(status=502, text="Bad Gateway")
            ready = self._ready(offset)
        batch = ready[:limit]
        self._redeliver = [u for u in self._redeliver if u not in batch]
        return self._ok(batch)

    def _ready(self, offset: int) -> list[dict[str, Any]]:
        if offset:
            self._pending = [u for u in self._pending
                             if not isinstance(u.get("update_id"), int)
                             or u["update_id"] >= offset]
        # Opt-in kinds (and defaults switched off by allowed_updates) are withheld;
        # unknown or malformed shapes are delivered so adapters can be tested on them.
        wanted = [u for u in self._pending if self._update_kind(u) in self._poll.allowed
                  or self._update_kind(u) not in DEFAULT_ALLOWED | _OPT_IN]
        return list(self._redeliver) + wanted

    async def _m_deletewebhook(self, p: dict[str, Any]) -> web.Response:
        self.webhook = None
        if p.get("drop_pending_updates"):
            self._pending.clear()
        return self._ok(True)

    async def _m_setwebhook(self, p: dict[str, Any]) -> web.Response:
        url = p.get("url") or ""
        secret = p.get("secret_token")
        if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", str(secret)):
            return self._error(400, "Bad Request: secret token contains unallowed characters")
        if not url:
            self.webhook = None
            return self._ok(True)
        self.webhook = {"url": url, "secret_token": secret,
                        "allowed_updates": p.get("allowed_updates")}
        if p.get("allowed_updates"):
            self._poll.allowed = set(p["allowed_updates"])
        if p.get("drop_pending_updates"):
            self._pending.clear()
        self._wake("conflict")
        for u in list(self._pending):
            self._spawn(self._post_webhook(u))
        return self._ok(True)

    async def _m_getwebhookinfo(self, p: dict[str, Any]) -> web.Response:
        hook = self.webhook or {}
        info = {"url": hook.get("url", ""), "has_custom_certificate": False,
                "pending_update_count": len(self._pending)}
        if hook.get("last_error"):
            info["last_error_date"], info["last_error_message"] = hook["last_error"]
        return self._ok(info)

    async def _m_setmycommands(self, p: dict[str, Any]) -> web.Response:
        commands = p.get("commands")
        if not isinstance(commands, list) or not all(
                isinstance(c, dict) and re.fullmatch(r"[a-z0-9_]{1,32}", c.get("command", ""))
                and 1 <= len(c.get("description", "")) <= 256 for c in commands):
            return self._error(400, "Bad Request: BOT_COMMAND_INVALID")
        scope = p.get("scope") or {"type": "default"}
        if not isinstance(scope, dict) or scope.get("type") not in _COMMAND_SCOPES:
            return self._error(400, "Bad Request: BOT_COMMAND_SCOPE_INVALID")
        self.commands_by_scope[scope["type"]] = commands
        if scope["type"] == "default":
            self.commands = commands
        return self._ok(True)

    async def _m_getmycommands(self, p: dict[str, Any]) -> web.Response:
        scope = (p.get("scope") or {}).get("type", "default")
        return self._ok(self.commands_by_scope.get(scope) or [])

    async def _m_sendchataction(self, p: dict[str, Any]) -> web.Response:
        if not p.get("chat_id"):
            return self._error(400, "Bad Request: chat_id is empty")
        if p.get("action") not in {"typing", "upload_photo", "record_video", "upload_video",
                                   "record_voice", "upload_voice", "upload_document",
                                   "choose_sticker", "find_location", "record_video_note",
                                   "upload_video_note"}:
            return self._error(400, "Bad Request: wrong parameter action in request")
        return self._ok(True)

    async def _m_setmessagereaction(self, p: dict[str, Any]) -> web.Response:
        if p.get("chat_id") in (None, "") or not p.get("message_id"):
            return self._error(400, "Bad Request: message to react not found")
        return self._ok(True)

    async def _m_pinchatmessage(self, p: dict[str, Any]) -> web.Response:
        if p.get("chat_id") in (None, "") or not p.get("message_id"):
            return self._error(400, "Bad Request: message to pin not found")
        return self._ok(True)

    async def _m_sendmessage(self, p: dict[str, Any]) -> web.Response:
        chat_id, text = p.get("chat_id"), p.get("text")
        if chat_id in (None, ""):
            return self._error(400, "Bad Request: chat_id is empty")
        if not isinstance(chat_id, int):
            return self._error(400, "Bad Request: chat not found")
        if not text:
            return self._error(400, "Bad Request: message text is empty")
        mode = str(p.get("parse_mode") or "").lower()
        if mode == "html":
            try:
                text = parse_html(text)
            except EntityParseError as exc:
                return self._error(400, f"Bad Request: can't parse entities: {exc}")
        elif mode:
            return self._error(400, "Bad Request: unsupported parse_mode")
        if not text.strip():
            return self._error(400, "Bad Request: message text is empty")
        if utf16_len(text) > 4096:
            return self._error(400, "Bad Request: message is too long")
        chat = self.chat(chat_id)
        msg: dict[str, Any] = {"message_id": self._new_message_id(chat_id),
                               "from": self.bot_user, "chat": chat,
                               "date": int(time.time()), "text": text}
        thread = p.get("message_thread_id")
        if thread is not None:
            if (chat_id, int(thread)) not in self.topics:
                return self._error(400, "Bad Request: message thread not found")
            msg["message_thread_id"] = int(thread)
            msg["is_topic_message"] = True
        reply = p.get("reply_parameters")
        if isinstance(reply, dict) and "message_id" in reply:
            target = self.messages.get((chat_id, int(reply["message_id"])))
            if target is None and not reply.get("allow_sending_without_reply"):
                return self._error(400, "Bad Request: message to be replied not found")
            if target is not None:
                msg["reply_to_message"] = target
        markup, err = self._inline_markup(p)
        if err is not None:
            return err
        if markup is not None:
            msg["reply_markup"] = markup
            self.keyboard_messages.append((chat_id, msg["message_id"]))
        self.messages[(chat_id, msg["message_id"])] = msg
        return self._ok(msg)

    def _inline_markup(self, p: dict[str, Any]) -> tuple[dict | None, web.Response | None]:
        """``reply_markup`` as an InlineKeyboardMarkup (Bot API: rows of buttons, each with
        ``text`` and exactly one of ``callback_data`` (1-64 bytes) or ``url``), or the
        real 400s."""
        markup = p.get("reply_markup")
        if markup is None:
            return None, None
        rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            return None, self._error(400, "Bad Request: can't parse reply keyboard markup "
                                          "JSON object")
        for button in (b for r in rows for b in r):
            if not isinstance(button, dict) or not button.get("text"):
                return None, self._error(400, "Bad Request: text buttons are unallowed in "
                                              "the inline keyboard")
            data = button.get("callback_data")
            if (data is None) == (button.get("url") is None) or (
                    data is not None and not 1 <= len(str(data).encode()) <= 64):
                return None, self._error(400, "Bad Request: BUTTON_DATA_INVALID")
        return {"inline_keyboard": rows}, None

    def press_button(self, chat_id: int, message_id: int, data: str, *, user_id: int,
                     first_name: str = "Alice", username: str | None = None) -> dict[str, Any]:
        """A user presses the inline button with ``callback_data`` ``data`` on a message
        the bot sent: queues a ``callback_query`` update (Bot API: CallbackQuery with
        ``id``, ``from``, ``message``, ``chat_instance``, ``data``). Raises ValueError when
        that message shows no such button (a real client could not press it)."""
        msg = self.messages.get((chat_id, message_id))
        rows = (msg or {}).get("reply_markup", {}).get("inline_keyboard", [])
        if not any(b.get("callback_data") == data for r in rows for b in r):
            raise ValueError(f"message {message_id} in chat {chat_id} has no button {data!r}")
        self._next_callback += 1
        query_id = str(4_000_000_000 + self._next_callback)
        self.callback_queries[query_id] = None  # not answered yet
        return self.inject_update({"callback_query": {
            "id": query_id, "from": self.user(user_id, first_name, username),
            "message": {k: v for k, v in msg.items() if not k.startswith("_")},
            "chat_instance": f"ci{chat_id}", "data": data}})

    async def _m_answercallbackquery(self, p: dict[str, Any]) -> web.Response:
        qid = str(p.get("callback_query_id") or "")
        if qid not in self.callback_queries or self.callback_queries[qid] is not None:
            return self._error(400, "Bad Request: query is too old and response timeout "
                                    "expired or query ID is invalid")
        text = p.get("text") or ""
        if utf16_len(text) > 200:
            return self._error(400, "Bad Request: MESSAGE_TOO_LONG")
        self.callback_queries[qid] = {"text": text, "show_alert": bool(p.get("show_alert"))}
        return self._ok(True)

    async def _m_editmessagereplymarkup(self, p: dict[str, Any]) -> web.Response:
        chat_id, mid = p.get("chat_id"), p.get("message_id")
        msg = self.messages.get((chat_id, mid)) if isinstance(mid, int) else None
        if msg is None or msg.get("from") != self.bot_user:
            return self._error(400, "Bad Request: message to edit not found")
        markup, err = self._inline_markup(p)
        if err is not None:
            return err
        if markup == msg.get("reply_markup"):
            return self._error(400, "Bad Request: message is not modified: specified new "
                                    "message content and reply markup are exactly the same")
        if markup is None:
            msg.pop("reply_markup", None)  # no markup: the keyboard is removed
        else:
            msg["reply_markup"] = markup
        msg["edit_date"] = int(time.time())
        return self._ok({k: v for k, v in msg.items() if not k.startswith("_")})

    def keyboard(self, chat_id: int, message_id: int) -> list[list[dict[str, Any]]]:
        """The inline keyboard a message shows now ([] when none)."""
        msg = self.messages.get((chat_id, message_id)) or {}
        return msg.get("reply_markup", {}).get("inline_keyboard", [])

    def _parsed_text(self, p: dict[str, Any]) -> tuple[str | None, web.Response | None]:
        """The message text after entity parsing (as sendMessage checks it), or an error."""
        text = p.get("text")
        if not text:
            return None, self._error(400, "Bad Request: message text is empty")
        mode = str(p.get("parse_mode") or "").lower()
        if mode == "html":
            try:
                text = parse_html(text)
            except EntityParseError as exc:
                return None, self._error(400, f"Bad Request: can't parse entities: {exc}")
        elif mode:
            return None, self._error(400, "Bad Request: unsupported parse_mode")
        if utf16_len(text) > 4096:
            return None, self._error(400, "Bad Request: message is too long")
        return text, None

    async def _m_editmessagetext(self, p: dict[str, Any]) -> web.Response:
        chat_id, mid = p.get("chat_id"), p.get("message_id")
        msg = self.messages.get((chat_id, mid)) if isinstance(mid, int) else None
        if msg is None or msg.get("from") != self.bot_user:
            return self._error(400, "Bad Request: message to edit not found")
        text, err = self._parsed_text(p)
        if err is not None:
            return err
        if text == msg["text"] and p.get("parse_mode") == msg.get("_parse_mode"):
            return self._error(400, "Bad Request: message is not modified: specified new "
                                    "message content and reply markup are exactly the same")
        markup, err = self._inline_markup(p)
        if err is not None:
            return err
        msg.update({"text": text, "edit_date": int(time.time()),
                    "_parse_mode": p.get("parse_mode")})
        if markup is None:  # an edit without reply_markup removes the inline keyboard
            msg.pop("reply_markup", None)
        else:
            msg["reply_markup"] = markup
        return self._ok({k: v for k, v in msg.items() if not k.startswith("_")})

    async def _m_deletemessage(self, p: dict[str, Any]) -> web.Response:
        key = (p.get("chat_id"), p.get("message_id"))
        if key not in self.messages:
            return self._error(400, "Bad Request: message to delete not found")
        del self.messages[key]
        return self._ok(True)

    async def _m_sendmessagedraft(self, p: dict[str, Any]) -> web.Response:
        chat_id, draft_id = p.get("chat_id"), p.get("draft_id")
        if not isinstance(chat_id, int) or chat_id <= 0:
            return self._error(400, "Bad Request: drafts can be sent only to private chats")
        if not isinstance(draft_id, int) or draft_id == 0:
            return self._error(400, "Bad Request: draft_id must be non-zero")
        text, err = self._parsed_text(p)
        if err is not None:
            return err
        self.drafts[(chat_id, draft_id)] = text
        return self._ok(True)

    async def _m_setmessagereaction(self, p: dict[str, Any]) -> web.Response:
        key = (p.get("chat_id"), p.get("message_id"))
        reaction = p.get("reaction") or []
        self.reactions[key] = [r.get("emoji") for r in reaction if isinstance(r, dict)]
        return self._ok(True)

    def chat_view(self, chat_id: int) -> list[str]:
        """What the chat shows now: the bot's messages (after edits and deletions), oldest
        first, as parsed text."""
        return [m["text"] for (c, mid), m in sorted(self.messages.items())
                if c == chat_id and m.get("from") == self.bot_user and "text" in m]

    def edits(self, chat_id: int | None = None) -> list[dict[str, Any]]:
        """Successful editMessageText payloads (optionally for one chat)."""
        return [s["payload"] for s in self.sent
                if s["method"].lower() == "editmessagetext" and s["status"] == 200
                and (chat_id is None or str(s["payload"].get("chat_id")) == str(chat_id))]

    # ----------------------------------------------------------------- control API
    def _control_routes(self) -> list[web.RouteDef]:
        """``/_control/*`` for tests in another process (JSON in, JSON out):

        POST message {text, chat_id, user_id, ...inject_message kwargs} -> update
        POST update {raw update} -> update;  POST redeliver {update_id} -> update
        POST edit {chat_id, message_id, new_text};  POST reaction {chat_id, message_id,
        user_id, new, old};  POST topic {chat_id, name} -> {thread_id}
        POST fail {method, status, count, retry_after, description, only_formatted}
        POST rate_limit {count, retry_after};  POST reject_markup {count}
        POST outage {mode, duration};  POST recover;  POST reset
        GET sent -> [records];  GET state -> {webhook, commands, pending, calls}
        """
        async def body(request: web.Request) -> dict[str, Any]:
            return (await request.json()) if request.can_read_body else {}

        def injector(fn: Any) -> Any:
            async def handler(request: web.Request) -> web.Response:
                try:
                    result = fn(**(await body(request)))
                    if asyncio.iscoroutine(result):
                        result = await result
                except (TypeError, KeyError, ValueError) as exc:
                    return web.json_response({"error": repr(exc)}, status=400)
                return web.json_response(result if result is not None else {"ok": True})
            return handler

        def redeliver(update_id: int) -> dict[str, Any]:
            matches = [u for u in self.updates if u.get("update_id") == update_id]
            if not matches:
                raise KeyError(f"no update {update_id}")
            self.redeliver(matches[-1])
            return matches[-1]

        def outage(mode: str = "5xx", duration: float | None = None) -> None:
            if mode == "refuse" and not duration:
                raise ValueError("a refuse outage needs a duration (the control API goes "
                                 "down with it)")
            # answer first: a 'refuse' outage closes this very connection
            self._spawn(self.outage(mode, duration))

        def reset() -> None:
            self._drops.clear()
            for items in (self.sent, self.calls, self._failures, self.webhook_deliveries):
                items.clear()

        def state() -> dict[str, Any]:
            return {"webhook": self.webhook, "commands": self.commands, "bot": self.bot_user,
                    "pending": len(self._pending), "calls": self.calls,
                    "outage": self.outage_mode, "webhook_deliveries": self.webhook_deliveries}

        posts = {"message": self.inject_message, "update": lambda **u: self.inject_update(u),
                 "edit": self.inject_edit, "reaction": self.inject_reaction,
                 "topic": lambda **kw: {"thread_id": self.create_topic(**kw)},
                 "redeliver": redeliver, "fail": self.fail, "rate_limit": self.rate_limit,
                 "drop_after_accept": self.drop_after_accept,
                 "reject_markup": self.reject_markup, "outage": outage,
                 "recover": self.recover, "reset": reset}
        routes = [web.post(f"/_control/{name}", injector(fn)) for name, fn in posts.items()]
        routes.append(web.get("/_control/sent", injector(lambda: self.sent)))
        routes.append(web.get("/_control/state", injector(state)))
        return routes


class FakeTelegramHandle:
    """A FakeTelegram running on its own event loop in a daemon thread."""

    def __init__(self, fake: FakeTelegram, loop: asyncio.AbstractEventLoop,
                 thread: threading.Thread) -> None:
        self.fake, self._loop, self._thread = fake, loop, thread
        self.url = fake.url

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (sync or async) on the fake's loop; return its result."""
        async def run() -> Any:
            result = fn(*args, **kwargs)
            return await result if asyncio.iscoroutine(result) else result
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.fake.stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def start_in_thread(**kwargs: Any) -> FakeTelegramHandle:
    """Start a FakeTelegram (``FakeTelegram`` kwargs) in a background thread; returns a handle
    with ``.url``, ``.fake``, ``.call(fn, ...)`` and ``.stop()``."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            box["fake"] = loop.run_until_complete(FakeTelegram(**kwargs).start())
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            box["error"] = exc
            ready.set()
            return
        box["loop"] = loop
        ready.set()
        loop.run_forever()
        loop.close()

    thread = threading.Thread(target=run, name="fake-telegram", daemon=True)
    thread.start()
    ready.wait(10)
    if "error" in box:
        raise box["error"]
    return FakeTelegramHandle(box["fake"], box["loop"], thread)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="fake Telegram Bot API server")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default=DEFAULT_TOKEN)
    args = parser.parse_args()

    async def main() -> None:
        fake = await FakeTelegram(args.token, port=args.port).start()
        print(json.dumps({"url": fake.url}), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
