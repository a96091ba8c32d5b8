"""Telegram's stream sender for channels/outbound/streaming.py.

Private chats use ``sendMessageDraft`` (Bot API 9.3+, python-telegram-bot >= 22.6: an
animated draft that is replaced by one final ``sendMessage``) when the installed library has
it; other chats, and private chats without it, post with ``sendMessage`` and grow the
message with ``editMessageText``. A discarded part is removed with ``deleteMessage`` (a
draft simply lapses). Errors map as in channels/telegram/send.py: 429 -> RateLimited,
"can't parse entities" -> MarkupRejected; "message is not modified" is not an error.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from telegram import Bot, Message, ReplyParameters
from telegram.constants import ParseMode
from telegram.error import BadRequest, RetryAfter

from channels.base import OutboundMessage
from channels.outbound.delivery import MarkupRejected, RateLimited
from channels.telegram.send import chat_id, retry_after_seconds

T = TypeVar("T")
_draft_ids = itertools.count(1)


def drafts_supported() -> bool:
    """Whether the installed python-telegram-bot has ``Bot.send_message_draft``."""
    return hasattr(Bot, "send_message_draft")


async def _mapped(call: Callable[[], Awaitable[T]]) -> T | None:
    try:
        return await call()
    except RetryAfter as exc:
        raise RateLimited(retry_after_seconds(exc)) from exc
    except BadRequest as exc:
        text = str(exc).lower()
        if "message is not modified" in text:
            return None
        if "can't parse entities" in text:
            raise MarkupRejected(str(exc)) from exc
        raise


class TelegramStream:
    """Messages of one streamed reply to ``message.to`` (forum topic ``thread_id``);
    ``draft``: use sendMessageDraft until a part is final (private chats only)."""

    platform = "telegram"

    def __init__(self, bot: Bot, message: OutboundMessage, *, draft: bool) -> None:
        self.bot, self.message, self.draft = bot, message, draft
        self.chat = chat_id(message.to)
        self.thread = int(message.thread_id) if (message.thread_id or "").isdigit() else None
        self.reply = int(message.reply_to) if (message.reply_to or "").isdigit() else None
        self.ids: dict[int, int] = {}
        self.texts: dict[int, str] = {}
        self.draft_ids: dict[int, int] = {}

    def _reply_params(self, index: int) -> ReplyParameters | None:
        if self.reply is None or (index and not self.message.reply_to_all):
            return None
        return ReplyParameters(self.reply, allow_sending_without_reply=True)

    async def show(self, index: int, text: str, *, formatted: bool, final: bool) -> None:
        mode = ParseMode.HTML if formatted else None
        if self.texts.get(index) == text and (index in self.ids or not final):
            return
        if index in self.ids:
            await _mapped(lambda: self.bot.edit_message_text(
                text, chat_id=self.chat, message_id=self.ids[index], parse_mode=mode))
        elif self.draft and not final:
            draft_id = self.draft_ids.setdefault(index, next(_draft_ids))
            await _mapped(lambda: self.bot.send_message_draft(
                self.chat, draft_id, text, message_thread_id=self.thread, parse_mode=mode))
        else:
            sent: Message | None = await _mapped(lambda: self.bot.send_message(
                self.chat, text, parse_mode=mode, message_thread_id=self.thread,
                reply_parameters=self._reply_params(index)))
            if sent is not None:
                self.ids[index] = sent.message_id
        self.texts[index] = text

    async def discard(self, index: int) -> None:
        self.texts.pop(index, None)
        self.draft_ids.pop(index, None)
        mid = self.ids.pop(index, None)
        if mid is not None:
            await _mapped(lambda: self.bot.delete_message(self.chat, mid))


def stream_for(bot: Bot, message: OutboundMessage, *, private: bool) -> Any:
    """The sender for one streamed reply (drafts in private chats when supported)."""
    return TelegramStream(bot, message, draft=private and drafts_supported())
