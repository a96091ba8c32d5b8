"""Block Kit buttons and their presses for the fake Slack
(https://docs.slack.dev/reference/block-kit, https://docs.slack.dev/reference/interaction-payloads/block_actions-payload):

- ``chat.postMessage`` / ``chat.update`` with ``blocks``: checked (``invalid_blocks`` for
  an unknown block type, a button without ``text.type == plain_text``, ``text`` over 75
  characters, an ``action_id`` over 255 characters or repeated in one message, a ``value``
  over 2000 characters) and stored on the message (``chat.update`` replaces text and
  blocks: what the channel shows now, :meth:`shown`).
- :meth:`press_button`: a user presses a button of a message the bot posted — a
  ``block_actions`` payload (``user``, ``channel``, ``container``, ``message``,
  ``actions[{action_id, block_id, value, type: button, action_ts}]``, ``response_url``,
  ``trigger_id``) delivered as a Socket Mode ``interactive`` envelope, or as a signed
  form POST ``payload=<json>`` to the HTTP target. Its ``response_url`` takes the
  ephemeral answers (responses.py).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from tests.fakes.fake_slack.wire import _err

_BLOCKS = {"section", "actions", "context", "divider", "header", "rich_text"}


def blocks_problem(blocks: Any) -> str | None:
    """Why Slack would refuse ``blocks`` (``invalid_blocks``), or None."""
    if isinstance(blocks, str):
        try:
            blocks = json.loads(blocks)
        except ValueError:
            return "blocks is not JSON"
    if not isinstance(blocks, list):
        return "blocks must be a list"
    seen: set[str] = set()
    for block in blocks:
        if not isinstance(block, dict) or block.get("type") not in _BLOCKS:
            return f"unknown block type {block!r:.60}"
        for el in block.get("elements") or [] if block["type"] == "actions" else []:
            if el.get("type") != "button":
                continue
            text = el.get("text") or {}
            if text.get("type") != "plain_text" or not 1 <= len(text.get("text", "")) <= 75:
                return "button text must be plain_text of 1-75 characters"
            aid = str(el.get("action_id") or "")
            if not 1 <= len(aid) <= 255 or aid in seen:
                return "action_id missing, too long or repeated"
            seen.add(aid)
            if len(str(el.get("value") or "")) > 2000:
                return "value too long"
    return None


class Interactivity:
    """Mixed into ``FakeSlack`` (tests/fakes/fake_slack/__init__.py)."""

    def _blocks_refused(self, args: dict[str, Any]) -> web.Response | None:
        if "blocks" not in args:
            return None
        problem = blocks_problem(args["blocks"])
        if problem:
            self.block_errors.append(problem)
            return _err("invalid_blocks")
        if isinstance(args["blocks"], str):
            args["blocks"] = json.loads(args["blocks"])
        return None

    def _find(self, channel: str, ts: str) -> dict[str, Any] | None:
        return next((m for m in self.history.get(channel, []) if m.get("ts") == ts), None)

    def _update_shown(self, channel: str, ts: str, args: dict[str, Any]) -> None:
        msg = self._find(channel, ts)
        if msg is not None:
            msg["text"] = args.get("text", msg.get("text", ""))
            if "blocks" in args:
                msg["blocks"] = args["blocks"]
            else:
                msg.pop("blocks", None)

    def shown(self, channel: str, ts: str) -> dict[str, Any]:
        """The message as the channel shows it now (text, blocks)."""
        return dict(self._find(channel, ts) or {})

    def buttons(self, channel: str, ts: str) -> list[dict[str, Any]]:
        """The buttons a message shows now."""
        msg = self._find(channel, ts) or {}
        return [el for b in msg.get("blocks") or [] if b.get("type") == "actions"
                for el in b.get("elements") or [] if el.get("type") == "button"]

    async def press_button(self, channel: str, ts: str, action_id: str, *,
                           user: str) -> dict[str, Any]:
        """``user`` presses the button ``action_id`` on message ``ts``. Raises ValueError
        when the message shows no such button. Returns the payload."""
        msg = self._find(channel, ts)
        [button] = [b for b in self.buttons(channel, ts) if b["action_id"] == action_id] or [None]
        if msg is None or button is None:
            raise ValueError(f"message {ts} in {channel} has no button {action_id!r}")
        block_id = next(b.get("block_id", "") for b in msg["blocks"] if button in
                        (b.get("elements") or []))
        payload = {
            "type": "block_actions", "team": {"id": self.team_id, "domain": "fake"},
            "user": {"id": user, "username": self.users.get(user, {}).get("name", user),
                     "team_id": self.team_id},
            "api_app_id": self.app_id, "token": "fake-verification-token",
            "container": {"type": "message", "message_ts": ts, "channel_id": channel,
                          "is_ephemeral": False},
            "trigger_id": uuid.uuid4().hex, "channel": {"id": channel, "name": channel},
            "message": msg,
            "response_url": self.responses.new(self.url, user=user, channel=channel,
                                               command="block_actions"),
            "actions": [{"action_id": action_id, "block_id": block_id, "type": "button",
                         "value": button.get("value", ""), "text": button["text"],
                         "action_ts": f"{time.time():.6f}"}],
        }
        self.presses.append(payload)
        if self._live_sockets():
            env = {"envelope_id": str(uuid.uuid4()), "payload": payload,
                   "type": "interactive", "accepts_response_payload": False}
            self.envelopes.append(env)
            await self._live_sockets()[-1].send_json(env)
        elif self.http_target:
            await self.post_signed(urlencode({"payload": json.dumps(payload)}).encode(),
                                   content_type="application/x-www-form-urlencoded")
        else:
            raise RuntimeError("no socket and no HTTP target to deliver the press to")
        return payload
