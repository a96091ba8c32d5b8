"""Message REST routes: history, create (limits, 50035, nonces with enforce_nonce, injected
failures), edit/delete, reactions, pins, threads (developer docs, resources/message)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from tests.fakes.fake_discord.components import components_problem
from tests.fakes.fake_discord.wire import (
    ATTACHMENT_LIMIT,
    TEXT_LIMIT,
    error,
    json_response,
    now_iso,
)


class MessageRoutes:
    """Mixed into ``FakeDiscord`` (tests/fakes/fake_discord/__init__.py), whose fields it
    uses."""


    def _history(self, channel_id: str, query: Any) -> web.Response:
        """``GET /channels/{id}/messages?after=&limit=``: newest first, as Discord."""
        if self._channel(channel_id) is None:
            return error(404, 10003, "Unknown Channel")
        after = int(query.get("after") or 0)
        limit = max(1, min(100, int(query.get("limit") or 50)))
        rows = sorted((m for m in self.messages.values()
                       if str(m.get("channel_id")) == channel_id and int(m["id"]) > after),
                      key=lambda m: int(m["id"]))[:limit]
        return json_response(list(reversed(rows)))

    async def _message_action(self, method: str, parts: list[str],
                              body: dict[str, Any]) -> web.Response | None:
        """Reactions, pins and threads: ``PUT .../messages/{mid}/reactions/{emoji}/@me``,
        ``PUT .../messages/pins/{mid}``, ``POST .../messages/{mid}/threads``,
        ``POST /channels/{id}/threads``."""
        if not parts or parts[0] != "channels" or len(parts) < 3:
            return None
        if self._channel(parts[1]) is None:
            return error(404, 10003, "Unknown Channel")
        if method == "PUT" and len(parts) == 7 and parts[4] == "reactions" and parts[6] == "@me":
            return web.Response(status=204)
        if method == "PUT" and len(parts) == 5 and parts[2:4] == ["messages", "pins"]:
            return web.Response(status=204)
        if method == "POST" and parts[-1] == "threads" and len(parts) == 5:
            # From a message: the thread takes the message's id; one thread per message.
            started = self.messages.get(parts[3])
            if started is None or started.get("channel_id") != parts[1]:
                return error(404, 10008, "Unknown Message")
            if self.refuse_threads:
                return error(403, 50013, "Missing Permissions")
            if parts[3] in self._threads:
                return error(400, 160004, "A thread has already been created for this "
                              "message")
            if not 1 <= len(str(body.get("name") or "")) <= 100:
                return error(400, 50035, "Invalid Form Body")
            tid = await self.create_thread(str(body["name"]), parts[1], thread_id=parts[3])
            return json_response(self._threads[tid], 201)
        if method == "POST" and parts[-1] == "threads" and len(parts) == 3:
            tid = await self.create_thread(str(body.get("name") or "thread"), parts[1])
            return json_response(self._threads[tid], 201)
        return None

    async def _create_message(self, channel_id: str, body: dict[str, Any]) -> web.Response:
        failure = self._take_failure()
        if failure is not None and failure.kind == "429":
            return json_response({"message": "You are being rate limited.",
                          "retry_after": failure.retry_after, "global": failure.is_global},
                         429, {"Via": "1.1 google", "Retry-After": str(int(failure.retry_after
                                                                          + 0.999)),
                               "X-RateLimit-Scope": "user"})
        if failure is not None and failure.kind == "markup":
            return error(400, 50035, "Invalid Form Body", {"content": {"_errors": [
                {"code": "BASE_TYPE_BAD_FORMAT", "message": "Invalid content formatting."}]}})
        if failure is not None and failure.kind != "drop":
            return error(failure.status, 0, f"{failure.status}: fake failure")
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
                    return json_response(out)
        return self._new_message(channel_id, body)

    def _new_message(self, channel_id: str, body: dict[str, Any]) -> web.Response:
        channel = self._channel(channel_id)
        if channel is None:
            return error(404, 10003, "Unknown Channel")
        content = body.get("content") or ""
        files = body.get("_files") or []
        if sum(len(f["data"]) for f in files) > ATTACHMENT_LIMIT:
            return error(413, 40005, "Request entity too large")
        if not content and not body.get("embeds") and not files and not body.get("components"):
            return error(400, 50006, "Cannot send an empty message")
        if "components" in body and components_problem(body["components"]):
            return error(400, 50035, "Invalid Form Body", {"components": {"_errors": [
                {"code": "COMPONENT_INVALID",
                 "message": components_problem(body["components"])}]}})
        if len(content) > TEXT_LIMIT:
            return error(400, 50035, "Invalid Form Body", {"content": {"_errors": [
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
        if body.get("components"):
            msg["components"] = body["components"]
        self.messages[msg["id"]] = msg
        if self.echo_own_messages:
            # Discord sends the bot its own messages; the adapter must drop them.
            task = asyncio.create_task(self.dispatch("MESSAGE_CREATE", msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        out = dict(msg)
        out.pop("member", None)
        return json_response(out)

    def _change_message(self, method: str, channel_id: str, message_id: str,
                        body: dict[str, Any]) -> web.StreamResponse:
        failure = self._take_failure()
        if failure is not None and failure.kind == "429":
            return json_response({"message": "You are being rate limited.",
                          "retry_after": failure.retry_after, "global": False}, 429,
                         {"Via": "1.1 google", "X-RateLimit-Scope": "user"})
        msg = self.messages.get(message_id)
        if msg is None or msg.get("channel_id") != channel_id:
            return error(404, 10008, "Unknown Message")
        if msg["author"]["id"] != self.bot.id:
            return error(403, 50005, "Cannot edit a message authored by another user")
        if method == "DELETE":
            del self.messages[message_id]
            return web.Response(status=204)
        content = body.get("content")
        if "components" in body and components_problem(body["components"] or []):
            return error(400, 50035, "Invalid Form Body")
        if content is not None:
            if len(content) > TEXT_LIMIT:
                return error(400, 50035, "Invalid Form Body")
            msg["content"] = content
            msg["edited_timestamp"] = now_iso()
        if "components" in body:  # [] (or null) removes them
            msg["components"] = body["components"] or []
        out = dict(msg)
        out.pop("member", None)
        return json_response(out)

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
