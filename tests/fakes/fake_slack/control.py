"""The ``/_control/*`` endpoints that let a test in another process drive the fake."""

from __future__ import annotations

from typing import Any

from aiohttp import web


class ControlRoutes:
    """Mixed into ``FakeSlack`` (tests/fakes/fake_slack/__init__.py), whose state it
    uses."""


    async def _control_get(self, request: web.Request) -> web.Response:
        what = request.match_info["what"]
        data: Any = {
            "sent": self.sent, "calls": self.calls, "acks": self.acks,
            "envelopes": self.envelopes, "http_responses": self.http_responses,
            "state": {"connected_sockets": self.connected_sockets, "outage": self.outage,
                      "pending": len(self._pending), "url": self.url,
                      "connections_opened": self.connections_opened,
                      "redeliver_after": self.redeliver_after},
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
        elif what == "redelivery":  # Slack's retries of unacked events (None: off)
            after = body.get("after")
            self.redeliver_after = None if after is None else float(after)
            self.max_retries = int(body.get("max_retries", self.max_retries))
        elif what == "http_target":
            self.http_target = body.get("url")
        elif what == "reset":
            self.reset()
        else:
            raise ValueError(f"unknown control {what!r}")
        return None
