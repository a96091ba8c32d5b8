"""The gateway WebSocket (Discord developer docs, "Gateway" and "Gateway Events"): HELLO,
heartbeats, IDENTIFY -> READY + GUILD_CREATE, close 4004/4014, and sessions that outlive
their connection: every dispatch is kept in its session's buffer; op 6 RESUME of a known
session replays the dispatches after ``seq`` in order and ends with RESUMED (a connection
still attached to that session is closed); an unknown, invalidated (the client closed
with 1000/1001) or too old position gets op 9 Invalid Session ``d: false``. READY's
``resume_gateway_url`` is ``/resume-gateway`` on this server (same handler)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes.fake_discord.wire import MESSAGE_CONTENT_INTENT, Conn, Session, error

INVALIDATING_CLOSES = (1000, 1001)  # a client closing so ends its session (docs)


class GatewaySocket:
    """Mixed into ``FakeDiscord`` (tests/fakes/fake_discord/__init__.py), whose fields it
    uses (``_sessions``: session id -> :class:`Session`; ``resumes``: each accepted or
    refused RESUME as ``{"session_id", "seq", "path", "accepted", "replayed"}``)."""

    @property
    def resume_gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/resume-gateway"

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        if self._outage:
            return error(503, 0, "Service Unavailable")
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        conn = Conn(ws, path=request.path)
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
            self._detach(conn)
        return ws

    def _detach(self, conn: Conn) -> None:
        session = conn.session
        if session is None or session.conn is not conn:
            return
        session.conn = None
        if not conn.kicked and conn.ws.close_code in INVALIDATING_CLOSES:
            self._sessions.pop(session.id, None)

    async def _on_frame(self, conn: Conn, frame: dict[str, Any]) -> None:
        op, d = frame.get("op"), frame.get("d")
        logged = {"op": op, "d": {k: v for k, v in d.items() if k != "token"}
                  if isinstance(d, dict) else d, "path": conn.path}
        self.gateway_log.append(logged)
        if op == 1:
            await conn.ws.send_str(json.dumps({"op": 11, "s": None, "t": None, "d": None}))
        elif op in (2, 6) and (not isinstance(d, dict) or d.get("token") != self.token):
            await conn.ws.close(code=4004, message=b"Authentication failed.")
        elif op == 2:
            await self._identify(conn, d)
        elif op == 6:
            await self._resume(conn, d)

    async def _identify(self, conn: Conn, d: dict[str, Any]) -> None:
        intents = int(d.get("intents") or 0)
        if intents & MESSAGE_CONTENT_INTENT and not self.privileged_intents:
            await conn.ws.close(code=4014, message=b"Disallowed intent(s).")
            return
        self.identify_count += 1
        session = Session(uuid.uuid4().hex, intents, conn=conn)
        self._sessions[session.id] = session
        conn.session, conn.ready = session, True
        await self._send_dispatch(conn, "READY", {
            "v": 10, "user": {**self.bot.payload(), "verified": True, "flags": 0,
                              "mfa_enabled": False},
            "guilds": [{"id": self.guild_id, "unavailable": True}],
            "session_id": session.id, "session_type": "normal",
            "resume_gateway_url": self.resume_gateway_url, "private_channels": [],
            "application": {"id": self.bot.id, "flags": 0}})
        await self._send_dispatch(conn, "GUILD_CREATE", self.guild_payload())

    async def _resume(self, conn: Conn, d: dict[str, Any]) -> None:
        session = self._sessions.get(str(d.get("session_id")))
        seq = d.get("seq") if isinstance(d.get("seq"), int) else 0
        record = {"session_id": d.get("session_id"), "seq": d.get("seq"),
                  "path": conn.path, "accepted": False, "replayed": 0}
        self.resumes.append(record)
        oldest = session.buffer[0][0] if session is not None and session.buffer else None
        if session is None or seq > session.seq or (oldest is not None and seq < oldest - 1):
            await conn.ws.send_str(json.dumps({"op": 9, "s": None, "t": None, "d": False}))
            return
        previous = session.conn
        self.resume_count += 1
        conn.session, session.conn = session, conn
        if previous is not None and previous is not conn:  # resumed elsewhere: drop it
            previous.kicked, previous.ready = True, False
            # not awaited: a paused client never answers the close handshake
            task = asyncio.get_running_loop().create_task(
                previous.ws.close(code=4000, message=b"session resumed elsewhere"))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        missed = [frame for s, frame in session.buffer if s > seq]
        for frame in missed:
            await conn.ws.send_str(json.dumps(frame))
        record.update(accepted=True, replayed=len(missed))
        conn.ready = True
        await self._send_dispatch(conn, "RESUMED", {})

    async def _send_dispatch(self, conn: Conn, event: str, data: Any) -> None:
        assert conn.session is not None
        await conn.ws.send_str(json.dumps(self._record(conn.session, event, data)))

    def _record(self, session: Session, event: str, data: Any) -> dict[str, Any]:
        session.seq += 1
        frame = {"op": 0, "t": event, "s": session.seq, "d": data}
        session.buffer.append((session.seq, frame))
        return frame
