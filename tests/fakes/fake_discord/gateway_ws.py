"""The gateway WebSocket: HELLO, heartbeats, IDENTIFY -> READY + GUILD_CREATE, RESUME ->
RESUMED or INVALID_SESSION, close 4004/4014 (developer docs, events/gateway)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes.fake_discord.wire import MESSAGE_CONTENT_INTENT, Conn, error


class GatewaySocket:
    """Mixed into ``FakeDiscord`` (tests/fakes/fake_discord/__init__.py), whose fields it
    uses."""



    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        if self._outage:
            return error(503, 0, "Service Unavailable")
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        conn = Conn(ws)
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

    async def _on_frame(self, conn: Conn, frame: dict[str, Any]) -> None:
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

    async def _send_dispatch(self, conn: Conn, event: str, data: Any) -> None:
        conn.seq += 1
        await conn.ws.send_str(json.dumps({"op": 0, "t": event, "s": conn.seq, "d": data}))
