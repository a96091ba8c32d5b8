"""A fake WhatsApp Cloud API for tests: the Graph API endpoints a business uses and
Meta's webhook sender (aiohttp on 127.0.0.1, ephemeral port).

It follows Meta's documented API (developers.facebook.com/docs/whatsapp/cloud-api):

- ``GET /{version}/{phone-number-id}`` -> ``{display_phone_number, verified_name, id}``;
- ``POST /{version}/{phone-number-id}/messages`` (JSON): ``text`` (``body`` <= 4096
  characters), ``image``/``audio``/``document``/``video`` by uploaded media ``id``,
  ``reaction``, ``template``, and ``{"status": "read", "message_id", "typing_indicator"}``;
  answers ``{"messaging_product", "contacts": [{"input", "wa_id"}], "messages": [{"id":
  "wamid..."}]}``;
- ``POST /{version}/{phone-number-id}/media`` (multipart ``file``, ``type``,
  ``messaging_product``) -> ``{"id"}``; ``GET /{version}/{media-id}`` -> ``{url,
  mime_type, sha256, file_size, id}``; ``GET <url>`` (bearer) -> the bytes;
- errors as Graph error objects ``{"error": {"message", "type", "code",
  "error_subcode", "fbtrace_id"}}``: 190 for a bad token (401), 100 for bad parameters,
  131047 for a free-form message more than 24 hours after the user's last message
  (``now`` is injectable), 131009 for an unknown media id, 132001 for an unknown
  template, scripted failures (``fail``: e.g. a 500 with code 2);
- an outage (``down``): every Graph API call answers 503 with code 2;
- the webhook sender: the verification GET (``verify``), notifications POSTed with
  ``X-Hub-Signature-256`` (``inject_text``, ``inject_media``, ``inject_reaction``,
  ``post``, ``redeliver``) and status callbacks (``send_status``). A user message that
  is not answered 200 (the gateway is down) is kept and delivered again every
  ``retry_every`` seconds, as Meta retries, to the webhook URL set then.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientSession, web

TOKEN = "EAAG-fake-whatsapp-token"
PHONE_NUMBER_ID = "106540352242922"
WABA_ID = "102290129340398"
DISPLAY_NUMBER = "+1 555-010-0000"
WINDOW = 24 * 3600.0


@dataclass
class _Failure:
    status: int
    code: int
    message: str
    count: int


class FakeWhatsApp:
    """``now``: the clock the 24-hour rule is judged on (default ``time.time``)."""

    def __init__(self, *, token: str = TOKEN, phone_number_id: str = PHONE_NUMBER_ID,
                 version: str = "v21.0", now: Callable[[], float] = time.time,
                 templates: tuple[str, ...] = ("reopen_chat",)) -> None:
        self.token, self.phone_number_id, self.version = token, phone_number_id, version
        self.now = now
        self.templates = set(templates)
        self.requests: list[dict[str, Any]] = []  # every Graph API call
        self.accepted: list[dict[str, Any]] = []  # message bodies answered 200 (+ "id")
        self.media: dict[str, dict[str, Any]] = {}  # media id -> {data, mime, name}
        self.last_user_message: dict[str, float] = {}
        self.webhook: tuple[str, str, str] | None = None  # url, app secret, verify token
        self.deliveries: list[dict[str, Any]] = []  # webhook POSTs: {status, payload}
        self.down = False
        self.retry_every = 0.1
        self.undelivered: list[dict[str, Any]] = []
        self._retrier: asyncio.Task | None = None
        self._failures: list[_Failure] = []
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.url = ""

    # ------------------------------------------------------------------ server
    async def start(self) -> FakeWhatsApp:
        app = web.Application(client_max_size=200 * 1024 * 1024)
        v = self.version
        app.add_routes([web.get(f"/{v}/{{node}}", self._node),
                        web.post(f"/{v}/{{node}}/messages", self._messages),
                        web.post(f"/{v}/{{node}}/media", self._upload),
                        web.get("/download/{media_id}", self._download)])
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._retrier = asyncio.get_running_loop().create_task(self._retry_loop())
        return self

    async def stop(self) -> None:
        if self._retrier is not None:
            self._retrier.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retrier
        if self._runner is not None:
            await self._runner.cleanup()

    async def _retry_loop(self) -> None:
        while True:
            await asyncio.sleep(self.retry_every)
            for payload in list(self.undelivered):
                if self.webhook is not None and await self.post(payload) == 200:
                    self.undelivered.remove(payload)

    def _outage(self) -> web.Response:
        return self.error(503, 2, "Service temporarily unavailable")

    def fail(self, *, status: int = 500, code: int = 2, count: int = 1,
             message: str = "An unexpected error has occurred. Please retry your request "
                            "later.") -> None:
        """The next ``count`` message sends get this Graph error."""
        self._failures.append(_Failure(status, code, message, count))

    @staticmethod
    def error(status: int, code: int, message: str, *, details: str | None = None,
              subcode: int | None = None) -> web.Response:
        err: dict[str, Any] = {"message": message, "type": "OAuthException", "code": code,
                               "fbtrace_id": "A" + uuid.uuid4().hex[:10]}
        if subcode is not None:
            err["error_subcode"] = subcode
        if details:
            err["error_data"] = {"messaging_product": "whatsapp", "details": details}
        return web.json_response({"error": err}, status=status)

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    def _unauthorized(self) -> web.Response:
        return self.error(401, 190, "Invalid OAuth access token - Cannot parse access token")

    def _record(self, request: web.Request, body: Any, status: int) -> None:
        self.requests.append({"method": request.method, "path": request.path,
                              "body": body, "status": status, "time": time.time()})

    # ------------------------------------------------------------------ Graph API
    async def _node(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        if self.down:
            self._record(request, None, 503)
            return self._outage()
        if not self._authorized(request):
            self._record(request, None, 401)
            return self._unauthorized()
        self._record(request, dict(request.query), 200)
        if node == self.phone_number_id:
            return web.json_response({"display_phone_number": DISPLAY_NUMBER,
                                      "verified_name": "Tidegate Test", "id": node})
        if node in self.media:
            m = self.media[node]
            return web.json_response({
                "messaging_product": "whatsapp", "url": f"{self.url}/download/{node}",
                "mime_type": m["mime"], "sha256": hashlib.sha256(m["data"]).hexdigest(),
                "file_size": str(len(m["data"])), "id": node})
        return self.error(400, 100, f"Unsupported get request. Object with ID '{node}' "
                          "does not exist", subcode=33)

    async def _download(self, request: web.Request) -> web.Response:
        m = self.media.get(request.match_info["media_id"])
        if not self._authorized(request):
            self._record(request, None, 401)
            return self._unauthorized()
        self._record(request, None, 200 if m is not None else 404)
        if m is None:
            return web.Response(status=404)
        return web.Response(body=m["data"], content_type=m["mime"])

    async def _upload(self, request: web.Request) -> web.Response:
        if self.down:
            return self._outage()
        if not self._authorized(request):
            return self._unauthorized()
        form = await request.post()
        file, mime = form.get("file"), form.get("type")
        if form.get("messaging_product") != "whatsapp" or not hasattr(file, "file") \
                or not mime:
            self._record(request, None, 400)
            return self.error(400, 100, "(#100) The parameter messaging_product is required.")
        data = file.file.read()  # type: ignore[union-attr]
        media_id = str(1_000_000_000_000 + next(self._ids))
        self.media[media_id] = {"data": data, "mime": str(mime), "name": file.filename,
                                "uploaded": True}
        self._record(request, {"type": str(mime), "name": file.filename, "bytes": len(data)},
                     200)
        return web.json_response({"id": media_id})

    async def _messages(self, request: web.Request) -> web.Response:
        if self.down:
            self._record(request, None, 503)
            return self._outage()
        if request.match_info["node"] != self.phone_number_id:
            return self.error(400, 100, "Unsupported post request.", subcode=33)
        if not self._authorized(request):
            return self._unauthorized()
        try:
            body = await request.json()
        except ValueError:
            return self.error(400, 100, "(#100) Invalid JSON")
        answer = self._check(body)
        self._record(request, body, answer.status)
        return answer

    def _check(self, body: dict[str, Any]) -> web.Response:
        if body.get("messaging_product") != "whatsapp":
            return self.error(400, 100, "(#100) The parameter messaging_product is required.")
        if body.get("status") == "read":
            return web.json_response({"success": True})
        for f in self._failures:
            if f.count > 0:
                f.count -= 1
                return self.error(f.status, f.code, f.message)
        to, kind = str(body.get("to") or ""), body.get("type", "text")
        part = body.get(kind) if isinstance(body.get(kind), dict) else {}
        if kind == "text" and len(str(part.get("body") or "")) > 4096:
            return self.error(400, 100, "(#100) Param text['body'] must be at most 4096 "
                              "characters long.")
        if kind in ("image", "audio", "document", "video", "sticker") \
                and str(part.get("id")) not in self.media:
            return self.error(400, 131009, "(#131009) Parameter value is not valid",
                              details="Media id is not valid")
        if kind == "template" and part.get("name") not in self.templates:
            return self.error(404, 132001, "(#132001) Template name does not exist in the "
                              "translation", details=f"template name ({part.get('name')}) "
                              "does not exist in en_US")
        last = self.last_user_message.get(to)
        if kind != "template" and (last is None or self.now() - last > WINDOW):
            return self.error(400, 131047, "(#131047) Re-engagement message", details=(
                "Message failed to send because more than 24 hours have passed since the "
                "customer last replied to this number."))
        wamid = "wamid." + uuid.uuid4().hex.upper()
        self.accepted.append({**body, "id": wamid})
        return web.json_response({"messaging_product": "whatsapp",
                                  "contacts": [{"input": to, "wa_id": to}],
                                  "messages": [{"id": wamid, **(
                                      {"message_status": "accepted"}
                                      if kind == "template" else {})}]})

    # ------------------------------------------------------------------ readers
    def sent_to(self, to: str, kind: str | None = None) -> list[dict[str, Any]]:
        """Accepted messages to ``to`` (of ``type`` ``kind``), in order."""
        return [m for m in self.accepted if m.get("to") == to
                and (kind is None or m.get("type", "text") == kind)]

    def texts(self, to: str) -> list[str]:
        return [m["text"]["body"] for m in self.sent_to(to, "text")]

    def calls(self, path_end: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"].endswith(path_end)]

    # ------------------------------------------------------------------ webhooks
    def set_webhook(self, url: str, *, app_secret: str, verify_token: str) -> None:
        self.webhook = (url, app_secret, verify_token)

    async def verify(self, *, verify_token: str | None = None) -> tuple[int, str]:
        """Meta's verification request; returns (status, body)."""
        assert self.webhook is not None
        url, _, token = self.webhook
        challenge = str(next(self._ids) * 7919)
        params = {"hub.mode": "subscribe", "hub.challenge": challenge,
                  "hub.verify_token": token if verify_token is None else verify_token}
        async with ClientSession() as http, http.get(url, params=params) as r:
            return r.status, await r.text()

    def payload(self, *, messages: list[dict[str, Any]] | None = None,
                statuses: list[dict[str, Any]] | None = None,
                contacts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        value: dict[str, Any] = {"messaging_product": "whatsapp", "metadata": {
            "display_phone_number": DISPLAY_NUMBER.replace(" ", "").replace("-", "")[1:],
            "phone_number_id": self.phone_number_id}}
        if contacts:
            value["contacts"] = contacts
        if messages:
            value["messages"] = messages
        if statuses:
            value["statuses"] = statuses
        return {"object": "whatsapp_business_account",
                "entry": [{"id": WABA_ID, "changes": [{"value": value, "field": "messages"}]}]}

    async def post(self, payload: dict[str, Any], *, secret: str | None = None,
                   signature: str | None = None) -> int:
        """POST ``payload`` to the webhook, signed with the app secret (or ``secret``,
        or the literal ``signature`` header); returns the HTTP status."""
        assert self.webhook is not None
        url, app_secret, _ = self.webhook
        raw = json.dumps(payload).encode()
        sig = signature if signature is not None else "sha256=" + hmac.new(
            (secret or app_secret).encode(), raw, hashlib.sha256).hexdigest()
        try:
            async with ClientSession() as http, http.post(url, data=raw, headers={
                    "Content-Type": "application/json", "X-Hub-Signature-256": sig}) as r:
                status = r.status
        except OSError:  # aiohttp's connection errors: nobody listens at the URL
            status = 0
        self.deliveries.append({"status": status, "payload": payload})
        return status

    def _user_message(self, wa_id: str, kind: str, part: dict[str, Any],
                      context: str | None = None) -> dict[str, Any]:
        self.last_user_message[wa_id] = self.now()
        msg = {"from": wa_id, "id": "wamid." + uuid.uuid4().hex.upper(),
               "timestamp": str(int(self.now())), "type": kind, kind: part}
        if context:
            msg["context"] = {"from": self.phone_number_id, "id": context}
        return msg

    async def inject(self, wa_id: str, kind: str, part: dict[str, Any], *,
                     name: str = "Alice", context: str | None = None
                     ) -> tuple[dict[str, Any], int]:
        """A user message of ``kind`` from ``wa_id``; returns (payload, HTTP status)."""
        msg = self._user_message(wa_id, kind, part, context)
        payload = self.payload(messages=[msg], contacts=[{"profile": {"name": name},
                                                          "wa_id": wa_id}])
        status = await self.post(payload)
        if status != 200:
            self.undelivered.append(payload)  # Meta retries until it is answered 200
        return payload, status

    async def inject_text(self, wa_id: str, text: str, **kw: Any
                          ) -> tuple[dict[str, Any], int]:
        return await self.inject(wa_id, "text", {"body": text}, **kw)

    async def inject_media(self, wa_id: str, kind: str, data: bytes, mime: str, *,
                           caption: str | None = None, filename: str | None = None,
                           **kw: Any) -> tuple[dict[str, Any], int]:
        media_id = str(2_000_000_000_000 + next(self._ids))
        self.media[media_id] = {"data": data, "mime": mime, "name": filename}
        part: dict[str, Any] = {"id": media_id, "mime_type": mime,
                                "sha256": hashlib.sha256(data).hexdigest()}
        if caption:
            part["caption"] = caption
        if filename:
            part["filename"] = filename
        return await self.inject(wa_id, kind, part, **kw)

    async def inject_reaction(self, wa_id: str, message_id: str, emoji: str, **kw: Any
                              ) -> tuple[dict[str, Any], int]:
        return await self.inject(wa_id, "reaction", {"message_id": message_id,
                                                     "emoji": emoji}, **kw)

    async def redeliver(self, payload: dict[str, Any]) -> int:
        """Meta sends the same notification again (same ``wamid``s)."""
        return await self.post(payload)

    async def send_status(self, wamid: str, to: str, status: str, *,
                          error: dict[str, Any] | None = None) -> int:
        """A status callback for a message the business sent."""
        st: dict[str, Any] = {"id": wamid, "status": status, "recipient_id": to,
                              "timestamp": str(int(self.now()))}
        if error:
            st["errors"] = [error]
        return await self.post(self.payload(statuses=[st]))
