"""Message components for the fake Discord (Discord API reference: "Message Components",
"Button", "Receiving and Responding"):

- ``components`` on a created or edited message: action rows (type 1, at most 5 per
  message, at most 5 buttons each) of buttons (type 2; styles 1-4 need a ``custom_id`` of
  1-100 characters, unique in the message; style 5 a ``url``; ``label`` at most 80);
  anything else is 400 50035 Invalid Form Body. An edit with ``components: []`` removes
  them.
- :meth:`Components.press_button`: a user presses a button of a message the bot sent —
  an INTERACTION_CREATE of type 3 (MESSAGE_COMPONENT) with ``data.custom_id`` and
  ``data.component_type`` 2, the ``message``, ``user`` in DMs / ``member`` in guilds and an
  interaction token; answered through ``POST /interactions/{id}/{token}/callback`` (types
  4 and 5 as for commands, plus 6 DEFERRED_UPDATE_MESSAGE and 7 UPDATE_MESSAGE), one
  initial response within 3 s (interactions.py).
"""

from __future__ import annotations

import time
from typing import Any

from tests.fakes.fake_discord.interactions import Interaction


def components_problem(rows: Any) -> str | None:
    """Why Discord would refuse ``components`` (None when it would not)."""
    if not isinstance(rows, list) or len(rows) > 5:
        return "components must be a list of at most 5 action rows"
    seen: set[str] = set()
    for row in rows:
        items = row.get("components") if isinstance(row, dict) else None
        if row.get("type") != 1 or not isinstance(items, list) or not 1 <= len(items) <= 5:
            return "an action row (type 1) holds 1-5 components"
        for b in items:
            if not isinstance(b, dict) or b.get("type") != 2:
                return "only buttons (type 2) are supported here"
            if len(str(b.get("label") or "")) > 80:
                return "button label over 80 characters"
            style = b.get("style")
            if style == 5:
                if not b.get("url"):
                    return "a link button needs a url"
                continue
            cid = str(b.get("custom_id") or "")
            if style not in (1, 2, 3, 4) or not 1 <= len(cid) <= 100 or cid in seen:
                return "a button needs style 1-4 and a unique custom_id of 1-100 characters"
            seen.add(cid)
    return None


class Components:
    """Mixed into ``FakeDiscord`` (tests/fakes/fake_discord/__init__.py)."""

    def buttons(self, message_id: str) -> list[dict[str, Any]]:
        """The buttons a message shows now."""
        msg = self.messages.get(message_id) or {}
        return [b for row in msg.get("components") or [] for b in row.get("components", [])]

    async def press_button(self, message_id: str, custom_id: str, *,
                           user: Any) -> Interaction:
        """``user`` (a FakeUser) presses ``custom_id`` on a bot message. Raises ValueError
        when the message shows no such button. Returns the interaction record."""
        msg = self.messages.get(message_id)
        if msg is None or not any(b.get("custom_id") == custom_id
                                  for b in self.buttons(message_id)):
            raise ValueError(f"message {message_id} has no button {custom_id!r}")
        cid = msg["channel_id"]
        channel = self._channel(cid)
        guild = channel.get("type") != 1
        record = Interaction(id=self.new_id(), token=f"itok-{self.new_id()}", name=custom_id,
                             channel_id=cid, guild=guild, created=time.monotonic(),
                             kind=3)
        shown = {k: v for k, v in msg.items() if k != "member"}
        payload: dict[str, Any] = {
            "id": record.id, "application_id": self.bot.id, "type": 3,
            "data": {"custom_id": custom_id, "component_type": 2},
            "channel_id": cid, "channel": channel, "token": record.token, "version": 1,
            "message": shown, "locale": "en-US", "app_permissions": "274877975552",
            "entitlements": [], "attachment_size_limit": 10 * 1024 * 1024,
            "authorizing_integration_owners": {"0": self.guild_id} if guild
            else {"1": user.id}, "context": 0 if guild else 1}
        if guild:
            payload.update(guild_id=self.guild_id, guild_locale="en-US",
                           member={**self._member(user), "user": user.payload(),
                                   "permissions": "1071698660929"})
        else:
            payload["user"] = user.payload()
        self.interactions.by_id[record.id] = record
        self.interactions.by_token[record.token] = record
        await self.dispatch("INTERACTION_CREATE", payload)
        return record
