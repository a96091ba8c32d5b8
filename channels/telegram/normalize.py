"""Telegram ``Update`` -> ``InboundMessage`` / ``ChannelEvent`` (pure functions, no I/O).

Implements the normalisation rules of issue 3 for the Bot API update types the adapter
requests (https://core.telegram.org/bots/api#update): ``message`` / ``channel_post``
become InboundMessages; ``edited_message`` / ``edited_channel_post`` and
``message_reaction`` become ChannelEvents (seed 001 §system events: Telegram reactions are
ride-along events). Everything else is ignored (None).

Telegram specifics handled here:

- chat types: ``private`` -> dm (peer = sender), ``group``/``supergroup`` -> group,
  forum topics (``is_topic_message`` + ``message_thread_id``) -> thread, ``channel`` ->
  channel. ``message_thread_id`` without ``is_topic_message`` (a reply chain in a plain
  group) is NOT a thread.
- mentions: ``mention`` entities equal to ``@<bot username>`` (case-insensitive),
  ``text_mention`` entities for the bot's user id, ``/cmd@<bot username>`` commands, or a
  reply to one of the bot's messages. In a topic every message "replies" to the topic's
  creation message; that implicit reply is not a reply to the bot.
- entity offsets are UTF-16 code units (PTB's ``parse_entity`` converts them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from telegram import Bot, Message, MessageEntity, MessageReactionUpdated, Update

from channels.base import ChannelEvent, ChatType, InboundMessage
from channels.telegram.media import media_of

EVENT_TEXT_MAX = 300  # characters of edited text carried into a system event


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """The bot's own user: numeric ``id`` and ``username`` (without ``@``), from getMe."""

    id: int
    username: str

    @property
    def mention(self) -> str:
        return "@" + self.username.lower()


def _chat_type(message: Message) -> ChatType:
    if message.chat.type == "private":
        return "dm"
    if message.chat.type == "channel":
        return "channel"
    return "thread" if _topic_id(message) is not None else "group"


def _topic_id(message: Message) -> int | None:
    """The forum topic of a message, or None (General topic and plain groups)."""
    if message.is_topic_message and message.message_thread_id is not None:
        return message.message_thread_id
    return None


def _real_reply(message: Message) -> Message | None:
    """The message this one replies to, ignoring the implicit reply to a topic's root."""
    rt = message.reply_to_message
    if rt is None:
        return None
    if rt.forum_topic_created is not None:
        return None
    if message.is_topic_message and rt.message_id == message.message_thread_id:
        return None
    return rt


def _entities(message: Message) -> tuple[str, dict[MessageEntity, str]]:
    if message.text is not None:
        return message.text, message.parse_entities()
    if message.caption is not None:
        return message.caption, message.parse_caption_entities()
    return "", {}


def _addressed(entity: MessageEntity, value: str, bot: BotIdentity) -> bool:
    if entity.type == MessageEntity.MENTION:
        return value.lower() == bot.mention
    if entity.type == MessageEntity.TEXT_MENTION:
        return entity.user is not None and entity.user.id == bot.id
    if entity.type == MessageEntity.BOT_COMMAND and "@" in value:
        return "@" + value.split("@", 1)[1].lower() == bot.mention
    return False


def _strip_leading_mention(text: str, entities: dict[MessageEntity, str],
                           bot: BotIdentity) -> str:
    """Drop the bot's own @mention from the start; ``/cmd@bot`` becomes ``/cmd``."""
    for entity, value in entities.items():
        if entity.offset != 0 or not _addressed(entity, value, bot):
            continue
        if entity.type == MessageEntity.BOT_COMMAND:
            return value.split("@", 1)[0] + text[len(value):]
        return re.sub(r"^[\s,:;.!-]+", "", text[len(value):])
    if not entities and text.lower().startswith(bot.mention):
        rest = text[len(bot.mention):]
        if not rest[:1].isalnum() and rest[:1] != "_":
            return re.sub(r"^[\s,:;.!-]+", "", rest)
    return text


def _mentions(text: str, entities: dict[MessageEntity, str], bot: BotIdentity) -> bool:
    if any(_addressed(e, v, bot) for e, v in entities.items()):
        return True
    # Entities are authoritative; the regex only covers payloads that carry none.
    return not entities and re.search(
        rf"(?<![\w@]){re.escape(bot.mention)}(?!\w)", text, re.IGNORECASE) is not None


def _sender(message: Message) -> tuple[str, str | None, str | None, bool]:
    """(sender_id, display name, username, is_bot); anonymous admins/channels use the
    ``sender_chat``."""
    user = message.from_user
    if user is not None and message.sender_chat is None:
        return str(user.id), user.full_name, user.username, bool(user.is_bot)
    chat = message.sender_chat or message.chat
    return str(chat.id), chat.title or chat.full_name, chat.username, False


def inbound_from_update(update: Update, bot: BotIdentity, *, account_id: str,
                        received_at: float, raw: Any = None,
                        bot_api: Bot | None = None) -> InboundMessage | None:
    """The InboundMessage for a ``message`` / ``channel_post`` update, else None.

    Returns None for the bot's own messages and for messages with neither text, caption
    nor attachment (service messages). With ``bot_api`` the attachments become
    ``media`` (channels/telegram/media.py; fetched later, after the access policy). ``received_at`` is epoch seconds; ``raw`` is the update
    JSON as received (it carries ``update_id``). Raises AttributeError/TypeError only on a
    payload PTB accepted but that lacks what a message must have (callers log and skip).
    """
    message = update.message or update.channel_post
    if message is None:
        return None
    if message.from_user is not None and message.from_user.id == bot.id:
        return None
    text, entities = _entities(message)
    media = media_of(message, bot_api) if bot_api is not None else []
    if message.text is None and message.caption is None and not media:
        return None
    sender_id, sender_name, sender_username, is_bot = _sender(message)
    chat_type = _chat_type(message)
    topic = _topic_id(message)
    reply = _real_reply(message)
    replying_to_bot = bool(reply is not None and reply.from_user is not None
                           and reply.from_user.id == bot.id)
    return InboundMessage(
        channel="telegram",
        account_id=account_id,
        text=_strip_leading_mention(text, entities, bot),
        sender_id=sender_id,
        sender_name=sender_name,
        sender_username=sender_username,
        chat_type=chat_type,
        peer_id=sender_id if chat_type == "dm" else "",
        group_id=None if chat_type == "dm" else str(message.chat.id),
        thread_id=str(topic) if topic is not None else None,
        mentions_bot=replying_to_bot or _mentions(text, entities, bot),
        message_id=str(message.message_id),
        reply_to=str(reply.message_id) if reply is not None else None,
        received_at=received_at,
        is_bot=is_bot,
        raw=raw if raw is not None else update.to_dict(),
        media=media,
    )


def _event_base(message_chat: Any, sender_id: str | None, topic: int | None,
                account_id: str) -> dict[str, Any]:
    chat_type: ChatType
    if message_chat.type == "private":
        chat_type = "dm"
    elif message_chat.type == "channel":
        chat_type = "channel"
    else:
        chat_type = "thread" if topic is not None else "group"
    return {"channel": "telegram", "account_id": account_id, "chat_type": chat_type,
            "peer_id": (sender_id or str(message_chat.id)) if chat_type == "dm" else "",
            "group_id": None if chat_type == "dm" else str(message_chat.id),
            "thread_id": str(topic) if topic is not None else None, "sender_id": sender_id}


def _reaction_label(reaction: Any) -> str:
    emoji = getattr(reaction, "emoji", None)
    if emoji:
        return str(emoji)
    custom = getattr(reaction, "custom_emoji_id", None)
    return f"custom emoji {custom}" if custom else str(getattr(reaction, "type", "reaction"))


def _reaction_event(r: MessageReactionUpdated, account_id: str) -> ChannelEvent | None:
    old = [_reaction_label(x) for x in r.old_reaction]
    new = [_reaction_label(x) for x in r.new_reaction]
    added = [x for x in new if x not in old]
    removed = [x for x in old if x not in new]
    if r.user is not None:
        who, sender_id = r.user.full_name, str(r.user.id)
    elif r.actor_chat is not None:
        who, sender_id = r.actor_chat.title or "anonymous", str(r.actor_chat.id)
    else:
        who, sender_id = "anonymous", None
    parts = []
    if added:
        parts.append(f"added {' '.join(added)}")
    if removed:
        parts.append(f"removed {' '.join(removed)}")
    if not parts:
        return None
    text = f"Telegram reaction: {who} {' and '.join(parts)} on message {r.message_id}"
    return ChannelEvent(kind="reaction", text=text,
                        **_event_base(r.chat, sender_id, None, account_id))


def event_from_update(update: Update, bot: BotIdentity, *,
                      account_id: str) -> ChannelEvent | None:
    """A ChannelEvent for ``edited_message`` / ``edited_channel_post`` (kind ``edit``) and
    ``message_reaction`` (kind ``reaction``) updates; None for anything else or for the
    bot's own edits/reactions."""
    if update.message_reaction is not None:
        r = update.message_reaction
        if r.user is not None and r.user.id == bot.id:
            return None
        return _reaction_event(r, account_id)
    edited = update.edited_message or update.edited_channel_post
    if edited is None:
        return None
    if edited.from_user is not None and edited.from_user.id == bot.id:
        return None
    sender_id, sender_name, _, _ = _sender(edited)
    text, _ = _entities(edited)
    if len(text) > EVENT_TEXT_MAX:
        text = text[:EVENT_TEXT_MAX] + "…"
    return ChannelEvent(
        kind="edit",
        text=f"Telegram edit: {sender_name} edited message {edited.message_id}: {text}",
        **_event_base(edited.chat, sender_id, _topic_id(edited), account_id))
