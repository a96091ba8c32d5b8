"""Discord events -> ``InboundMessage`` / ``ChannelEvent`` (pure functions, no I/O).

Used by ``channels/discord/adapter.py``. Conversation mapping (issue 3, DESIGN.md "The path
of one message" step 1):

- DM channel -> ``dm``; ``peer_id`` is the author's user id.
- guild text/voice/news channel -> ``channel``; ``group_id`` is the channel id.
- thread (public, private, news, forum post) -> ``thread``; ``group_id`` is the parent
  channel id, ``thread_id`` the thread id (replies go to the thread).

``mentions_bot`` is true when the bot's user (``<@ID>``/``<@!ID>``) or its managed role
(``<@&ROLE>``, what Discord's autocomplete often inserts) is mentioned, or when the message
replies to one of the bot's messages. A leading bot mention is stripped from ``text``.
Discord API reference: https://discord.com/developers/docs/resources/message
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import discord

from channels.base import ChannelEvent, ChatType, InboundMessage
from channels.discord.media import media_of

CHANNEL = "discord"
# Message types that carry user text; joins, pins, boosts etc. are system notices.
_USER_TYPES = frozenset({discord.MessageType.default, discord.MessageType.reply})
_THREAD_TYPES = frozenset({discord.ChannelType.public_thread, discord.ChannelType.private_thread,
                           discord.ChannelType.news_thread})
EDIT_PREVIEW_CHARS = 300


@dataclass(frozen=True, slots=True)
class Conversation:
    """Where a message lives: ``chat_type`` plus ``group_id``/``thread_id`` (strings)."""

    chat_type: ChatType
    group_id: str | None = None
    thread_id: str | None = None


def conversation_of(channel: Any, guild_id: int | None = None) -> Conversation:
    """Map a discord.py channel object to a :class:`Conversation`.

    ``channel`` may be a ``Thread``, ``DMChannel``, ``GroupChannel``, any guild channel, or a
    ``PartialMessageable``/``Object`` for an uncached channel (then ``guild_id`` decides
    between ``dm`` and ``channel``; an uncached thread cannot be told apart here, see
    ``DiscordChannel._resolve_channel``).
    """
    if isinstance(channel, discord.Thread):
        return Conversation("thread", str(channel.parent_id), str(channel.id))
    if isinstance(channel, discord.DMChannel):
        return Conversation("dm")
    if isinstance(channel, discord.GroupChannel):
        return Conversation("group", str(channel.id))
    if isinstance(channel, discord.abc.GuildChannel):
        return Conversation("channel", str(channel.id))
    if guild_id is None and getattr(channel, "guild_id", None) is None:
        return Conversation("dm")
    return Conversation("channel", str(channel.id))


def is_uncached_thread(channel: Any) -> bool:
    """True for a ``PartialMessageable`` whose type says thread (parent id unknown)."""
    return isinstance(channel, discord.PartialMessageable) and channel.type in _THREAD_TYPES


def _mention_re(bot_id: int, role_ids: Iterable[int]) -> str:
    alts = [rf"<@!?{bot_id}>"] + [rf"<@&{rid}>" for rid in role_ids]
    return "(?:" + "|".join(alts) + ")"


def strip_bot_mention(text: str, bot_id: int, role_ids: Iterable[int] = (),
                      bot_name: str | None = None) -> str:
    """Remove leading bot mentions (``<@ID>``, ``<@!ID>``, ``<@&ROLE>``) and the separator
    after them (spaces, ``,``, ``:``); later mentions of the bot become ``@bot_name``."""
    pattern = _mention_re(bot_id, role_ids)
    text = re.sub(rf"^\s*(?:{pattern}[\s,:;]*)+", "", text)
    if bot_name:
        text = re.sub(pattern, lambda _m: f"@{bot_name}", text)  # name is not a template
    return text.strip()


def mentions_bot(message: discord.Message, bot_id: int, role_ids: Iterable[int] = ()) -> bool:
    """Mentioned by user id or managed role, or a reply to one of the bot's messages."""
    if any(u.id == bot_id for u in message.mentions) or bot_id in message.raw_mentions:
        return True
    roles = set(role_ids)
    if roles and roles.intersection(message.raw_role_mentions):
        return True
    ref = message.reference
    resolved = ref.resolved if ref is not None else None
    return isinstance(resolved, discord.Message) and resolved.author.id == bot_id


def is_user_message(message: discord.Message) -> bool:
    """Default messages and replies; system notices (joins, pins, boosts...) are not."""
    return message.type in _USER_TYPES


def to_inbound(message: discord.Message, conv: Conversation, *, bot_id: int,
               bot_role_ids: Iterable[int] = (), bot_name: str | None = None,
               account_id: str = "default", received_at: float = 0.0,
               raw: Any = None) -> InboundMessage | None:
    """Normalise one Discord message; None when it has nothing to say (empty content and no
    attachments — e.g. a guild message without the message content intent). Attachments
    become ``media`` (channels/discord/media.py), fetched after the access policy."""
    roles = tuple(bot_role_ids)
    text = strip_bot_mention(message.content or "", bot_id, roles, bot_name)
    media = media_of(message)
    if not text and not media:
        return None
    author = message.author
    ref = message.reference
    sender_id = str(author.id)
    return InboundMessage(
        channel=CHANNEL, account_id=account_id, text=text, chat_type=conv.chat_type,
        sender_id=sender_id, peer_id=sender_id, group_id=conv.group_id,
        thread_id=conv.thread_id, sender_name=author.display_name,
        sender_username=author.name, mentions_bot=mentions_bot(message, bot_id, roles),
        message_id=str(message.id),
        reply_to=str(ref.message_id) if ref is not None and ref.message_id else None,
        received_at=received_at, is_bot=bool(author.bot or message.webhook_id), raw=raw,
        media=media)


def _event(kind: str, text: str, conv: Conversation, *, account_id: str, peer_id: str,
           sender_id: str | None) -> ChannelEvent:
    return ChannelEvent(channel=CHANNEL, kind=kind, text=text, account_id=account_id,
                        chat_type=conv.chat_type, peer_id=peer_id, group_id=conv.group_id,
                        thread_id=conv.thread_id, sender_id=sender_id)


def _where(conv: Conversation) -> str:
    if conv.chat_type == "dm":
        return "in a direct message"
    if conv.chat_type == "thread":
        return f"in thread {conv.thread_id} of channel {conv.group_id}"
    return f"in channel {conv.group_id}"


def reaction_event(payload: discord.RawReactionActionEvent, conv: Conversation, *,
                   account_id: str, user_name: str | None = None) -> ChannelEvent:
    """kind ``reaction`` from MESSAGE_REACTION_ADD/REMOVE (the text says which)."""
    added = payload.event_type == "REACTION_ADD"
    who = user_name or str(payload.user_id)
    verb = "reacted" if added else "removed reaction"
    text = (f"Discord: {who} {verb} {payload.emoji} on message {payload.message_id} "
            f"{_where(conv)}")
    uid = str(payload.user_id)
    return _event("reaction", text, conv,
                  account_id=account_id, peer_id=uid, sender_id=uid)


def edit_event(message: discord.Message, conv: Conversation, *,
               account_id: str) -> ChannelEvent:
    """kind ``edit`` from MESSAGE_UPDATE (the new content, shortened)."""
    content = message.content or ""
    if len(content) > EDIT_PREVIEW_CHARS:
        content = content[:EDIT_PREVIEW_CHARS] + "…"
    who = message.author.display_name
    text = f"Discord: {who} edited message {message.id} {_where(conv)}: {content}"
    uid = str(message.author.id)
    return _event("edit", text, conv, account_id=account_id, peer_id=uid,
                  sender_id=uid)


def delete_event(message_id: int, conv: Conversation, *, account_id: str, peer_id: str,
                 author_id: str | None = None) -> ChannelEvent:
    """kind ``delete`` from MESSAGE_DELETE (the author only when cached)."""
    text = f"Discord: message {message_id} was deleted {_where(conv)}"
    return _event("delete", text, conv, account_id=account_id, peer_id=peer_id,
                  sender_id=author_id)


def pins_event(conv: Conversation, *, account_id: str, peer_id: str) -> ChannelEvent:
    """kind ``pin`` from CHANNEL_PINS_UPDATE."""
    return _event("pin", f"Discord: pinned messages changed {_where(conv)}", conv,
                  account_id=account_id, peer_id=peer_id, sender_id=None)


# ---------------------------------------------------------------------- raw gateway events


def _conversation(client: discord.Client, channel_id: int, guild_id: int | None) -> Conversation:
    return conversation_of(client.get_channel(channel_id) or discord.Object(id=channel_id),
                           guild_id)


def _dm_peer(client: discord.Client, channel_id: int,
             dm_peers: Mapping[int, str]) -> str | None:
    if channel_id in dm_peers:
        return dm_peers[channel_id]
    recipient = getattr(client.get_channel(channel_id), "recipient", None)
    return str(recipient.id) if recipient is not None else None


def raw_event(kind: str, payload: Any, *, client: discord.Client, bot_id: int,
              account_id: str, dm_peers: Mapping[int, str]) -> ChannelEvent | None:
    """Translate one discord.py raw event into a ChannelEvent, or None to ignore it.

    ``kind``: "reaction" (``RawReactionActionEvent``), "edit" (``RawMessageUpdateEvent``),
    "delete" (``RawMessageDeleteEvent``), "pins" (the channel of CHANNEL_PINS_UPDATE).
    Ignored: the bot's own reactions/edits/deletions, MESSAGE_UPDATEs that are not user
    edits (embed unfurls have no ``edited_timestamp``), events in DMs whose peer is unknown.
    ``dm_peers`` maps DM channel id -> user id (learnt from inbound DMs).
    """
    if kind == "reaction":
        if payload.user_id == bot_id:
            return None
        conv = _conversation(client, payload.channel_id, payload.guild_id)
        name = payload.member.display_name if payload.member is not None else None
        user = client.get_user(payload.user_id) if name is None else None
        return reaction_event(payload, conv, account_id=account_id,
                              user_name=name or (user.display_name if user else None))
    if kind == "edit":
        message, before = payload.message, payload.cached_message
        if message.author.id == bot_id or payload.data.get("edited_timestamp") is None:
            return None
        if before is not None and before.content == message.content:
            return None
        conv = _conversation(client, payload.channel_id, payload.guild_id)
        return edit_event(message, conv, account_id=account_id)
    if kind == "delete":
        cached = payload.cached_message
        if cached is not None and cached.author.id == bot_id:
            return None
        author = str(cached.author.id) if cached is not None else None
        conv = _conversation(client, payload.channel_id, payload.guild_id)
        dm_peer = _dm_peer(client, payload.channel_id, dm_peers) if conv.chat_type == "dm" \
            else None
        if conv.chat_type == "dm" and not dm_peer:
            return None
        return delete_event(payload.message_id, conv, account_id=account_id,
                            peer_id=dm_peer or author or "", author_id=author)
    if kind == "pins":
        conv = conversation_of(payload)
        dm_peer = _dm_peer(client, payload.id, dm_peers) if conv.chat_type == "dm" else ""
        if conv.chat_type == "dm" and not dm_peer:
            return None
        return pins_event(conv, account_id=account_id, peer_id=dm_peer or "")
    raise ValueError(f"unknown discord raw event kind {kind!r}")
