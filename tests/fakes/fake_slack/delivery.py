"""Delivering events: Socket Mode envelopes (and the socket itself), slash commands,
redeliveries, ``disconnect``, and signed HTTP POSTs for the Events API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from tests.fakes.fake_slack.wire import dm_channel_of, sign


class EventDelivery:
    """Mixed into ``FakeSlack`` (tests/fakes/fake_slack/__init__.py), whose state it
    uses."""


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
            self._sending(env)
            await live[-1].send_json(env)
        elif self.http_target:
            self._sending(env)
            if 200 <= await self._post_http(env) < 300:
                self._acked.add(env["envelope_id"])
        else:
            self._pending.append(env)

    def _sending(self, env: dict[str, Any]) -> None:
        """Record ``env`` as delivered now; with ``redeliver_after`` set, an events_api
        envelope gets Slack's retry if it is not acked in time."""
        self.envelopes.append(env)
        if self.redeliver_after is not None and env.get("type") == "events_api" \
                and int(env.get("retry_attempt") or 0) < self.max_retries:
            self._spawn(self._retry_unacked(env, self.redeliver_after))

    async def _retry_unacked(self, env: dict[str, Any], after: float) -> None:
        await asyncio.sleep(after)  # Slack's ack deadline, as configured for the fake
        if env["envelope_id"] not in self._acked:
            # a socket dying under the write: the retry's own timer already runs
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.redeliver(env, "timeout" if not self.http_target
                                     else "http_timeout")

    async def _post_http(self, env: dict[str, Any]) -> int:
        assert self._session is not None
        if env["type"] == "slash_commands":
            body = urlencode(env["payload"]).encode()
            ctype = "application/x-www-form-urlencoded"
        else:
            body = json.dumps(env["payload"]).encode()
            ctype = "application/json"
        return await self.post_signed(body, content_type=ctype,
                                      retry=env.get("retry_attempt") or 0,
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
            self._sending(env)
            await ws.send_json(env)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                try:
                    data = json.loads(msg.data)
                except ValueError:
                    continue
                if isinstance(data, dict) and "envelope_id" in data:
                    self.acks.append(data)
                    self._acked.add(str(data["envelope_id"]))
        return ws
