"""The ``/_control/*`` endpoints that let a test in another process drive the fake."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.fakes.fake_discord.wire import FakeUser, json_response


class ControlRoutes:
    """Mixed into ``FakeDiscord`` (tests/fakes/fake_discord/__init__.py), whose fields it
    uses."""



    async def _control(self, request: web.Request) -> web.StreamResponse:
        action = request.match_info["action"]
        body: dict[str, Any] = {}
        if request.method == "POST" and request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                return json_response({"error": "body must be JSON"}, 400)
        try:
            result = await self._control_action(request.method, action, body)
        except (KeyError, TypeError, ValueError) as exc:
            return json_response({"error": f"{type(exc).__name__}: {exc}"}, 400)
        if result is None:
            return json_response({"error": f"unknown control action {action!r}"}, 404)
        return json_response(result)

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
                    "resume_count": self.resume_count, "resumes": self.resumes,
                    "bot_id": self.bot.id,
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
