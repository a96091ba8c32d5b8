"""Web API methods the fake implements (https://docs.slack.dev/reference/methods): auth,
Socket Mode tickets, posting, updating, streaming, history, users."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from tests.fakes.fake_slack.wire import _DROP, _err, _formatted, _ok, dm_channel_of


class WebMethods:
    """Mixed into ``FakeSlack`` (tests/fakes/fake_slack/__init__.py), whose state it
    uses."""

    def _open_dm(self, args: dict[str, Any]) -> web.Response:
        """conversations.open with ``users`` (one user): the DM channel's id."""
        return _ok({"channel": {"id": dm_channel_of(str(args.get("users", "")))}})

    def _history(self, args: dict[str, Any]) -> web.Response:
        """conversations.history: top-level messages of ``channel`` newer than ``oldest``,
        newest first, at most ``limit``."""
        channel = self._resolve_channel(str(args.get("channel", "")))
        oldest = float(args.get("oldest") or 0)
        msgs = [m for m in reversed(self.history.get(channel, []))
                if float(m["ts"]) > oldest and m.get("thread_ts") in (None, m["ts"])]
        return _ok({"messages": msgs[:int(args.get("limit") or 100)], "has_more": False})

    def _check_token(self, method: str, token: str | None) -> web.Response | None:
        if not token:
            return _err("not_authed")
        if method == "apps.connections.open":
            if token.startswith("xoxb-"):
                return _err("not_allowed_token_type")
            return None if token == self.app_token else _err("invalid_auth")
        if token.startswith("xapp-"):
            return _err("not_allowed_token_type")
        return None if token == self.bot_token else _err("invalid_auth")

    def _injected(self, method: str, args: dict[str, Any]) -> web.Response | None:
        for rule in self.rules:
            if rule.method != method or rule.count <= 0:
                continue
            if rule.kind == "markup" and not _formatted(args):
                continue
            rule.count -= 1
            if rule.kind == "ratelimited":
                resp = web.json_response({"ok": False, "error": "ratelimited"}, status=429,
                                         headers={"Retry-After": str(rule.retry_after)})
                return resp
            if rule.kind == "drop":
                return _DROP
            if rule.kind == "5xx":
                return web.Response(status=rule.status, text="fake-slack failure",
                                    content_type="text/plain")
            return _err(rule.error)
        return None

    def _auth_test(self, args: dict[str, Any]) -> web.Response:
        return _ok({"url": "https://fake-slack.example/", "team": "Fake Team",
                    "user": self.bot_name, "team_id": self.team_id,
                    "user_id": self.bot_user_id, "bot_id": self.bot_id,
                    "is_enterprise_install": False})

    def _connections_open(self, args: dict[str, Any]) -> web.Response:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        ws_url = self.url.replace("http://", "ws://", 1)
        return _ok({"url": f"{ws_url}/link/?ticket={ticket}&app_id={self.app_id}"})

    def _resolve_channel(self, channel: str) -> str:
        return dm_channel_of(channel) if channel.startswith(("U", "W")) else channel

    def _post_message(self, args: dict[str, Any]) -> web.Response:
        channel = str(args.get("channel") or "")
        if not channel:
            return _err("channel_not_found")
        if not args.get("text") and not args.get("blocks") and not args.get("attachments"):
            return _err("no_text")
        if len(str(args.get("text") or "")) > 40000:
            return _err("msg_too_long")
        channel = self._resolve_channel(channel)
        ts = self.next_ts()
        msg = {"type": "message", "user": self.bot_user_id, "bot_id": self.bot_id,
               "app_id": self.app_id, "text": args.get("text", ""), "ts": ts,
               "team": self.team_id}
        if args.get("thread_ts"):
            msg["thread_ts"] = str(args["thread_ts"])
        if args.get("blocks"):
            msg["blocks"] = args["blocks"]
        self._remember(channel, msg)
        return _ok({"channel": channel, "ts": ts, "message": msg})

    # chat.startStream / appendStream / stopStream
    # (https://docs.slack.dev/reference/methods/chat.startStream and its siblings):
    # ``channel`` required everywhere, ``ts`` for append/stop; ``markdown_text`` (at most
    # 12,000 characters a call) is appended to what the message shows so far and is
    # required by appendStream; outside a DM, startStream needs ``recipient_user_id`` and
    # ``recipient_team_id``; a stopped stream takes no more text.
    def _stream_message(self, args: dict[str, Any]) -> dict[str, Any] | web.Response:
        channel = self._resolve_channel(str(args.get("channel") or ""))
        if not channel or not args.get("ts"):
            return _err("invalid_arguments")
        msg = next((m for m in self.history.get(channel, []) if m["ts"] == str(args["ts"])),
                   None)
        if msg is None:
            return _err("message_not_found")
        if not self.streams.get(msg["ts"]):
            return _err("message_not_in_streaming_state")
        if len(str(args.get("markdown_text") or "")) > 12000:
            return _err("msg_too_long")
        return msg

    def _start_stream(self, args: dict[str, Any]) -> web.Response:
        channel = str(args.get("channel") or "")
        if not channel:
            return _err("channel_not_found")
        channel = self._resolve_channel(channel)
        if not channel.startswith("D") and not (args.get("recipient_user_id")
                                                and args.get("recipient_team_id")):
            return _err("invalid_arguments")
        if len(str(args.get("markdown_text") or "")) > 12000:
            return _err("msg_too_long")
        ts = self.next_ts()
        msg = {"type": "message", "user": self.bot_user_id, "bot_id": self.bot_id,
               "app_id": self.app_id, "text": str(args.get("markdown_text") or ""), "ts": ts,
               "team": self.team_id}
        if args.get("thread_ts"):
            msg["thread_ts"] = str(args["thread_ts"])
        self.history.setdefault(channel, []).append(msg)
        self.streams[ts] = True
        return _ok({"channel": channel, "ts": ts})

    def _append_stream(self, args: dict[str, Any]) -> web.Response:
        if not args.get("markdown_text"):
            return _err("invalid_arguments")
        msg = self._stream_message(args)
        if isinstance(msg, web.Response):
            return msg
        msg["text"] += str(args["markdown_text"])
        return _ok({"channel": self._resolve_channel(str(args["channel"])), "ts": msg["ts"]})

    def _stop_stream(self, args: dict[str, Any]) -> web.Response:
        msg = self._stream_message(args)
        if isinstance(msg, web.Response):
            return msg
        msg["text"] += str(args.get("markdown_text") or "")
        self.streams[msg["ts"]] = False
        return _ok({"channel": self._resolve_channel(str(args["channel"])), "ts": msg["ts"],
                    "message": dict(msg)})

    def streamed(self, channel: str) -> list[dict[str, Any]]:
        """Messages of ``channel`` made with chat.startStream: ``text`` so far,
        ``streaming`` (not stopped yet), ``thread_ts``."""
        return [{"ts": m["ts"], "text": m["text"], "thread_ts": m.get("thread_ts"),
                 "streaming": self.streams[m["ts"]]}
                for m in self.history.get(channel, []) if m["ts"] in self.streams]

    def _conversations_replies(self, args: dict[str, Any]) -> web.Response:
        """The thread of ``ts`` in ``channel``: the root, then its replies, oldest first,
        ``limit`` per page with an opaque ``cursor`` (as Slack pages them)."""
        channel, root = str(args.get("channel") or ""), str(args.get("ts") or "")
        msgs = self.history.get(channel)
        if msgs is None:
            return _err("channel_not_found")
        thread = sorted((m for m in msgs if m.get("ts") == root or m.get("thread_ts") == root),
                        key=lambda m: float(m["ts"]))
        if not thread:
            return _err("thread_not_found")
        start, limit = int(args.get("cursor") or 0), max(1, min(1000, int(args.get("limit")
                                                                          or 1000)))
        page = thread[start:start + limit]
        more = start + limit < len(thread)
        return _ok({"messages": page, "has_more": more,
                    "response_metadata": {"next_cursor": str(start + limit) if more else ""}})

    def _chat_update(self, args: dict[str, Any]) -> web.Response:
        if not args.get("channel") or not args.get("ts"):
            return _err("message_not_found")
        self._update_shown(self._resolve_channel(str(args["channel"])), str(args["ts"]), args)
        return _ok({"channel": self._resolve_channel(str(args["channel"])),
                    "ts": str(args["ts"]), "text": args.get("text", "")})

    def _chat_delete(self, args: dict[str, Any]) -> web.Response:
        if not args.get("channel") or not args.get("ts"):
            return _err("message_not_found")
        return _ok({"channel": self._resolve_channel(str(args["channel"])),
                    "ts": str(args["ts"])})

    def _users_info(self, args: dict[str, Any]) -> web.Response:
        uid = str(args.get("user") or "")
        u = self.users.get(uid)
        if u is None:
            return _err("user_not_found")
        return _ok({"user": {
            "id": uid, "team_id": self.team_id, "name": u["name"], "real_name": u["real_name"],
            "is_bot": bool(u.get("is_bot")), "deleted": False,
            "profile": {"real_name": u["real_name"], "display_name": u.get("display_name", "")},
        }})

    def _ok(self, args: dict[str, Any]) -> web.Response:
        return _ok({})
