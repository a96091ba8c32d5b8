"""The webchat channel: the control UI page at ``/`` and its WebSocket at ``/ws`` on the
gateway's HTTP server.

The page asks for the gateway token once (or takes it from ``#token=...`` in the URL) and
keeps it in the browser's localStorage. WebSocket protocol (JSON text frames):

- client -> server: ``{"type": "message", "text": "..."}``
- server -> client: ``{"type": "ready", "client", "session_key"}``, ``{"type":
  "history", "messages": [{role, text, ts, tools}]}`` (the session's transcript tail as
  the chat showed it, silent replies left out, so a reload restores the chat),
  ``{"type": "thinking"}`` when a model round starts,
  ``{"type": "delta", "text"}`` while the model streams, ``{"type": "tool", "phase":
  "start"|"end", "tool", "call_id", "detail"}``, ``{"type": "round_end"}`` (a model round
  that called tools ended: the next text is a new bubble), ``{"type": "reply", "text",
  "run_id", "session_key", "session_id", "status", "silent"}`` at the end of the turn
  (``text`` as delivered; ``silent``: the agent answered ``NO_REPLY``, show nothing),
  ``{"type": "error", "error"}``.

Each browser gets its own session (``agent:<agent>:webchat:dm:<client id>``). The page's
session picker switches to another webchat session by reconnecting with that session's
client id (``/ws?client=<id>``; checked against ``[A-Za-z0-9_-]{1,64}`` and the token), so
only webchat sessions of the routed agent can be talked to from the page.
"""

from __future__ import annotations

import asyncio
import json
import re
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from aiohttp import WSCloseCode, WSMsgType, web

from channels.outbound.silent import SilentStream
from runtime.lanes import LaneClosed

log = structlog.get_logger(__name__)

_CLIENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SHUTTING_DOWN = "the gateway is shutting down; send it again in a moment"


def _page() -> str:
    return (Path(__file__).parent / "static" / "index.html").read_text("utf-8")


def webchat_routes(*, authorize: Callable[[web.Request], bool], submit: Callable[..., Any],
                   subscribe: Callable[[str, Callable], Callable[[], None]],
                   result_payload: Callable[[Any, str], dict[str, Any]],
                   history: Callable[[str], tuple[str, list[dict[str, Any]]]] | None = None,
                   on_shutdown: list[Callable[..., Any]] | None = None,
                   ) -> list[web.RouteDef]:
    """Routes of the webchat channel. ``submit(text, to=, channel="webchat")`` queues a
    turn (see gateway.channels.local.LocalChat.submit); ``history(client)`` returns the client's
    session key and its recent messages. ``on_shutdown``: the app's signal list
    (``app.on_shutdown``), given a hook that closes the open sockets when the server
    stops (an open page would otherwise hold the server's shutdown for its whole
    timeout)."""
    chat = WebChat(authorize, submit, subscribe, result_payload, history, _page())
    if on_shutdown is not None:
        on_shutdown.append(chat.close_sockets)
    return [web.get("/", chat.index), web.get("/ws", chat.ws_handler)]


class WebChat:
    """The page and the WebSocket of the webchat channel (module docstring); the callables
    are :func:`webchat_routes`' arguments."""

    def __init__(self, authorize: Callable[[web.Request], bool], submit: Callable[..., Any],
                 subscribe: Callable[[str, Callable], Callable[[], None]],
                 result_payload: Callable[[Any, str], dict[str, Any]],
                 history: Callable[[str], tuple[str, list[dict[str, Any]]]] | None,
                 page: str) -> None:
        self.authorize, self.submit, self.subscribe = authorize, submit, subscribe
        self.result_payload, self.history, self.page = result_payload, history, page
        self.sockets: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()

    async def close_sockets(self, _app: Any = None) -> None:
        """Close every open page socket (``going away``: the gateway stops; the page
        reconnects to the next one). Their turns were answered or cut off before."""
        for ws in list(self.sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"gateway stopping")

    async def index(self, _: web.Request) -> web.Response:
        """The control UI page (the token is given in the URL fragment and kept by the browser)."""
        return web.Response(text=self.page, content_type="text/html",
                            headers={"Cache-Control": "no-store",
                                     "Content-Security-Policy": "default-src 'self'; "
                                     "script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                     "connect-src 'self'; frame-ancestors 'none'",
                                     "X-Frame-Options": "DENY"})

    async def ws_handler(self, request: web.Request) -> web.StreamResponse:
        """The control UI's chat WebSocket (``?token=``): messages in, streamed replies out."""
        if not self.authorize(request):
            return web.json_response({"ok": False, "error": "unauthorized"}, status=401)
        client = request.query.get("client", "browser")
        if not _CLIENT_ID.match(client):
            return web.json_response({"ok": False, "error": "bad client id"}, status=400)
        ws = web.WebSocketResponse(heartbeat=30)
        await ws.prepare(request)
        self.sockets.add(ws)
        # the transcript store may block (PostgreSQL): read it off the event loop
        key, messages = await asyncio.to_thread(self.history, client) \
            if self.history is not None else ("", [])
        await ws.send_json({"type": "ready", "client": client, "session_key": key})
        await ws.send_json({"type": "history", "messages": messages})
        await self._read_frames(ws, client)
        return ws

    async def _read_frames(self, ws: web.WebSocketResponse, client: str) -> None:
        """Each ``message`` frame starts a turn (they run concurrently; the lane orders
        them) until the socket closes."""
        pending: set[asyncio.Task] = set()
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            try:
                data = json.loads(msg.data)
            except ValueError:
                await ws.send_json({"type": "error", "error": "frames must be JSON"})
                continue
            if isinstance(data, dict) and data.get("type") == "message":
                task = asyncio.get_running_loop().create_task(
                    self._run(ws, client, str(data.get("text", ""))))
                pending.add(task)
                task.add_done_callback(pending.discard)

    async def _run(self, ws: web.WebSocketResponse, client: str, text: str) -> None:
        """One turn: its events as frames while it runs, then the ``reply`` frame."""
        try:
            sub = self.submit(text, to=client, channel="webchat", stream=True)
        except ValueError as exc:
            await ws.send_json({"type": "error", "error": str(exc)})
            return
        except LaneClosed:
            await ws.send_json({"type": "error", "error": SHUTTING_DOWN})
            return

        shown = SilentStream()  # nothing of a silent reply reaches the page

        def on_event(ev: Any) -> None:
            for frame in _frames(ev, shown):
                if not ws.closed:
                    asyncio.ensure_future(ws.send_json(frame))

        unsubscribe = self.subscribe(sub.run_id, on_event)
        try:
            # not ``await sub.future``: its cancellation (a shutdown cut the turn off)
            # must reach the page as an error, not end this task silently
            await asyncio.wait({sub.future})
        finally:
            unsubscribe()
        if sub.future.cancelled() or sub.future.exception() is not None:
            error = SHUTTING_DOWN if sub.future.cancelled() else str(sub.future.exception())
            if not ws.closed:
                await ws.send_json({"type": "error", "error": error})
            return
        result = sub.future.result()
        if not ws.closed:
            payload = self.result_payload(result, sub.session_key)
            shown.end(payload.get("reply", ""))
            await ws.send_json({"type": "reply", **payload, "text": shown.reply,
                                "reply": shown.reply, "silent": shown.silent})


def _frames(ev: Any, shown: SilentStream) -> list[dict[str, Any]]:
    """The frames of one runtime event: text deltas as ``shown`` lets them through."""
    if ev.type == "message_update":
        text = shown.push(ev.data.get("delta", ""))
        return [{"type": "delta", "text": text}] if text else []
    if ev.type == "agent_start":  # a second one: the turn re-run elsewhere (a takeover)
        shown.attempt()
        return []
    if ev.type == "message_end" and ev.data.get("tool_calls"):
        text = shown.round_end()
        rest = [{"type": "delta", "text": text}] if text else []
        return [*rest, {"type": "round_end"}]
    frame = _frame(ev)
    return [frame] if frame is not None else []


def _frame(ev: Any) -> dict[str, Any] | None:
    """The WebSocket frame of one runtime event of the client's run (or None)."""
    d = ev.data
    if ev.type == "message_update":
        return {"type": "delta", "text": d.get("delta", "")}
    if ev.type == "message_start":
        return {"type": "thinking"}
    if ev.type == "message_end" and d.get("tool_calls"):
        return {"type": "round_end"}
    if ev.type in ("tool_execution_start", "tool_execution_end"):
        detail = d.get("arguments") if ev.type == "tool_execution_start" else (
            "error" if d.get("is_error") else "ok")
        text = detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False)
        return {"type": "tool", "phase": "start" if ev.type.endswith("start") else "end",
                "tool": d.get("tool"), "call_id": d.get("call_id"),
                "detail": (text or "")[:2000]}
    return None
