"""Discord's JSON objects as the fake sends them: guild, channels, threads, members, messages
(developer docs, resources/guild, channel, message)."""

from __future__ import annotations

from typing import Any

from tests.fakes.fake_discord.wire import FakeUser, now_iso


class Payloads:
    """Mixed into ``FakeDiscord`` (tests/fakes/fake_discord/__init__.py), whose fields it
    uses."""



    def _member(self, user: FakeUser) -> dict[str, Any]:
        roles = [self.bot_role_id] if user.id == self.bot.id else []
        return {"roles": roles, "nick": None, "joined_at": "2025-01-01T00:00:00+00:00",
                "deaf": False, "mute": False, "flags": 0, "pending": False}

    def _channel(self, cid: str) -> dict[str, Any] | None:
        if cid in (self.channel_id, self.other_channel_id):
            name = "general" if cid == self.channel_id else "random"
            return {"id": cid, "type": 0, "guild_id": self.guild_id, "name": name,
                    "position": 0 if cid == self.channel_id else 1,
                    "permission_overwrites": [], "parent_id": None, "nsfw": False,
                    "topic": None, "last_message_id": None, "rate_limit_per_user": 0,
                    "flags": 0}
        if cid == self.thread_id:
            return self._thread(cid, "help-thread")
        if cid in self._threads:
            return self._threads[cid]
        for uid, dm in self.dm_channels.items():
            if dm == cid:
                return {"id": dm, "type": 1, "last_message_id": None, "flags": 0,
                        "recipients": [self.users[uid].payload()]}
        return None

    def _thread(self, tid: str, name: str, parent_id: str | None = None) -> dict[str, Any]:
        return {"id": tid, "type": 11, "guild_id": self.guild_id,
                "parent_id": parent_id or self.channel_id, "owner_id": self.alice.id,
                "name": name, "last_message_id": None, "message_count": 1, "member_count": 2,
                "rate_limit_per_user": 0, "flags": 0, "total_message_sent": 1,
                "thread_metadata": {"archived": False, "auto_archive_duration": 1440,
                                    "archive_timestamp": now_iso(), "locked": False,
                                    "create_timestamp": now_iso()}}

    def guild_payload(self) -> dict[str, Any]:
        """The GUILD_CREATE payload: one guild, #general, #random, one thread, two roles."""
        return {
            "id": self.guild_id, "name": "Tide Test", "icon": None, "owner_id": self.alice.id,
            "unavailable": False, "large": False, "member_count": 4,
            "joined_at": "2025-01-01T00:00:00+00:00", "features": [], "afk_timeout": 300,
            "verification_level": 0, "default_message_notifications": 0,
            "explicit_content_filter": 0, "mfa_level": 0, "premium_tier": 0,
            "system_channel_id": self.channel_id, "preferred_locale": "en-US",
            "roles": [
                {"id": self.guild_id, "name": "@everyone", "permissions": "1071698660929",
                 "position": 0, "color": 0, "hoist": False, "managed": False,
                 "mentionable": False, "flags": 0},
                {"id": self.bot_role_id, "name": "tidebot", "permissions": "274877975552",
                 "position": 1, "color": 0, "hoist": False, "managed": True,
                 "mentionable": False, "flags": 0, "tags": {"bot_id": self.bot.id}},
            ],
            "emojis": [], "stickers": [],
            "channels": [self._channel(self.channel_id), self._channel(self.other_channel_id)],
            "threads": [self._channel(self.thread_id)],
            "members": [{**self._member(self.bot), "user": self.bot.payload()}],
            "presences": [], "voice_states": [], "stage_instances": [],
            "guild_scheduled_events": [], "soundboard_sounds": [],
        }

    def message_payload(self, text: str, *, author: FakeUser | None = None,
                        channel_id: str | None = None, guild: bool = True,
                        mentions: list[FakeUser] | None = None,
                        mention_roles: list[str] | None = None,
                        reply_to: dict[str, Any] | None = None,
                        message_id: str | None = None) -> dict[str, Any]:
        """A MESSAGE_CREATE ``d`` object (Discord's message object plus ``guild_id`` and
        ``member`` in guilds). ``reply_to`` is the referenced message object."""
        author = author or self.alice
        d: dict[str, Any] = {
            "id": message_id or self.new_id(), "channel_id": channel_id or self.channel_id,
            "author": author.payload(), "content": text, "timestamp": now_iso(),
            "edited_timestamp": None, "tts": False, "mention_everyone": False,
            "mentions": [], "mention_roles": mention_roles or [], "attachments": [],
            "embeds": [], "pinned": False, "type": 0, "flags": 0, "components": [],
        }
        if guild:
            d["guild_id"] = self.guild_id
            d["member"] = self._member(author)
        for u in mentions or []:
            m = u.payload()
            if guild:
                m["member"] = self._member(u)
            d["mentions"].append(m)
        if reply_to is not None:
            d["type"] = 19
            d["message_reference"] = {"type": 0, "message_id": reply_to["id"],
                                      "channel_id": reply_to["channel_id"]}
            if guild:
                d["message_reference"]["guild_id"] = self.guild_id
            d["referenced_message"] = reply_to
        return d

    def dm_channel_for(self, user: FakeUser) -> str:
        """The DM channel id between the bot and ``user`` (created on first use)."""
        if user.id not in self.dm_channels:
            self.dm_channels[user.id] = self.new_id()
        return self.dm_channels[user.id]
