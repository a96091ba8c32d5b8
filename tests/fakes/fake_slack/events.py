"""Slack event payloads a test pushes: messages, DMs, mentions, reactions, edits, deletions
(https://docs.slack.dev/reference/events)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from tests.fakes.fake_slack.wire import channel_type_of, dm_channel_of


class EventBuilders:
    """Mixed into ``FakeSlack`` (tests/fakes/fake_slack/__init__.py), whose state it
    uses."""


    def next_ts(self) -> str:
        """A fresh Slack message timestamp (``"<epoch>.<6 digits>"``, unique)."""
        return f"{int(time.time())}.{next(self._ts):06d}"

    def message(self, text: str, *, user: str = "U0ALICE", channel: str = "C0GENERAL",
                ts: str | None = None, thread_ts: str | None = None,
                parent_user_id: str | None = None, **extra: Any) -> dict[str, Any]:
        """A ``message`` event as Slack sends it for message.channels/groups/im."""
        ts = ts or self.next_ts()
        ev: dict[str, Any] = {
            "type": "message", "user": user, "text": text, "ts": ts, "team": self.team_id,
            "channel": channel, "event_ts": ts, "channel_type": channel_type_of(channel),
            "client_msg_id": str(uuid.uuid4()),
        }
        if thread_ts:
            ev["thread_ts"] = thread_ts
            ev["parent_user_id"] = parent_user_id or user
        ev.update(extra)
        return ev

    def dm(self, text: str, *, user: str = "U0ALICE", **kw: Any) -> dict[str, Any]:
        """A message.im event from ``user`` in its IM channel with the bot."""
        return self.message(text, user=user, channel=dm_channel_of(user), **kw)

    def mention_text(self, text: str) -> str:
        return f"<@{self.bot_user_id}> {text}"

    def app_mention(self, text: str, *, user: str = "U0ALICE", channel: str = "C0GENERAL",
                    ts: str | None = None, thread_ts: str | None = None) -> dict[str, Any]:
        """An ``app_mention`` event (no channel_type field, as in Slack's payloads)."""
        ts = ts or self.next_ts()
        ev = {"type": "app_mention", "user": user, "text": text, "ts": ts,
              "team": self.team_id, "channel": channel, "event_ts": ts}
        if thread_ts:
            ev["thread_ts"] = thread_ts
        return ev

    def reaction(self, reaction: str, *, item_ts: str, channel: str = "C0GENERAL",
                 user: str = "U0ALICE", item_user: str | None = None) -> dict[str, Any]:
        """A ``reaction_added`` event on a message."""
        return {"type": "reaction_added", "user": user, "reaction": reaction,
                "item_user": item_user or self.bot_user_id,
                "item": {"type": "message", "channel": channel, "ts": item_ts},
                "event_ts": self.next_ts()}

    def edit(self, *, channel: str, ts: str, text: str, old_text: str = "",
             user: str = "U0ALICE", thread_ts: str | None = None) -> dict[str, Any]:
        """A ``message_changed`` event (hidden, the new message nested under ``message``)."""
        inner: dict[str, Any] = {"type": "message", "user": user, "text": text, "ts": ts,
                                 "edited": {"user": user, "ts": self.next_ts()}}
        prev: dict[str, Any] = {"type": "message", "user": user, "text": old_text, "ts": ts}
        if thread_ts:
            inner["thread_ts"] = prev["thread_ts"] = thread_ts
        now = self.next_ts()
        return {"type": "message", "subtype": "message_changed", "hidden": True,
                "channel": channel, "channel_type": channel_type_of(channel), "ts": now,
                "event_ts": now, "message": inner, "previous_message": prev}

    def delete(self, *, channel: str, ts: str, user: str = "U0ALICE") -> dict[str, Any]:
        """A ``message_deleted`` event."""
        now = self.next_ts()
        return {"type": "message", "subtype": "message_deleted", "hidden": True,
                "channel": channel, "channel_type": channel_type_of(channel), "ts": now,
                "deleted_ts": ts, "event_ts": now,
                "previous_message": {"type": "message", "user": user, "text": "", "ts": ts}}

    def build(self, kind: str, **kw: Any) -> dict[str, Any]:
        """Event by name, for the control endpoint: dm, message (channel), mention, thread
        (message with thread_ts), app_mention, reaction, edit, delete."""
        if kind == "dm":
            return self.dm(kw.pop("text"), **kw)
        if kind in ("message", "channel", "thread"):
            return self.message(kw.pop("text"), **kw)
        if kind == "mention":
            return self.message(self.mention_text(kw.pop("text")), **kw)
        if kind == "app_mention":
            return self.app_mention(kw.pop("text"), **kw)
        if kind == "reaction":
            return self.reaction(kw.pop("reaction"), **kw)
        if kind == "edit":
            return self.edit(**kw)
        if kind == "delete":
            return self.delete(**kw)
        raise ValueError(f"unknown event kind {kind!r}")
