"""Telegram's stream sender for channels/outbound/streaming.py.

Private chats use ``sendMessageDraft`` (Bot API 9.3+, python-telegram-bot >= 22.6: an
animated draft that is replaced by one final ``sendMessage``) when the installed library has
it; other chats, and private chats without it, post with ``sendMessage`` and grow the
message with ``editMessageText``. A discarded part is removed with ``deleteMessage`` (a
draft simply lapses). Errors map as in channels/telegram/send.py: 429 -> RateLimited,
"can't parse entities" -> MarkupRejected; "message is not modified" is not an error.

A Bot API server that does not know ``sendMessageDraft`` (404 Not Found, or 400 "method not
found" from an older self-hosted server) would leave the user staring at nothing while the
model streams: the first such refusal switches that bot to sendMessage + editMessageText for
good (logged once, ``telegram_drafts_unavailable``) and the same text is posted at once.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog
from telegram import Bot, Message, ReplyParameters
from telegram.constants import ParseMode
from telegram.error import BadRequest, InvalidToken, RetryAfter

from channels.base import OutboundMessage
from channels.outbound.delivery import MarkupRejected, RateLimited
from channels.telegram.send import chat_id, retry_after_seconds

log = structlog.get_logger(__name__)
T = TypeVar("T")
_draft_ids = itertools.count(1)
# Bots whose server refused drafts, by identity: a Bot compares equal to any Bot of the
# same bot account (python-telegram-bot's __eq__), which a WeakSet would conflate.
_no_drafts: dict[int, weakref.ref[Bot]] = {}


def _drafts_off(bot: Bot) -> bool:
    ref = _no_drafts.get(id(bot))
    return ref is not None and ref() is bot


def _turn_drafts_off(bot: Bot) -> None:
    key = id(bot)
    _no_drafts[key] = weakref.ref(bot, lambda _r: _no_drafts.pop(key, None))


class _DraftsUnavailable(Exception):
    """sendMessageDraft is unknown to this Bot API server."""


def _drafts_refused(exc: Exception) -> bool:
    """404 (python-telegram-bot maps it to InvalidToken) or a 400 naming the method as
    unknown: the server lacks sendMessageDraft, the token itself works."""
    text = str(exc).lower()
    return isinstance(exc, InvalidToken) and "not found" in text or (
        isinstance(exc, BadRequest) and "method" in text and "not found" in text)


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

    def lasting(self, index: int, final: bool) -> bool:
        """Whether showing part ``index`` now posts a real message (False: a draft, which
        lapses by itself and leaves nothing in the chat)."""
        return index in self.ids or final or not self.draft or self.bot in _no_drafts

    async def show(self, index: int, text: str, *, formatted: bool, final: bool) -> None:
        mode = ParseMode.HTML if formatted else None
        if self.texts.get(index) == text and (index in self.ids or not final):
            return
        if index in self.ids:
            await _mapped(lambda: self.bot.edit_message_text(
                text, chat_id=self.chat, message_id=self.ids[index], parse_mode=mode))
        elif self.draft and not final and not _drafts_off(self.bot):
            try:
                await self._draft(index, text, mode)
            except _DraftsUnavailable:
                await self._post(index, text, mode)
        else:
            await self._post(index, text, mode)
        self.texts[index] = text

    async def _draft(self, index: int, text: str, mode: str | None) -> None:
        draft_id = self.draft_ids.setdefault(index, next(_draft_ids))
        try:
            await _mapped(lambda: self.bot.send_message_draft(
                self.chat, draft_id, text, message_thread_id=self.thread, parse_mode=mode))
        except (InvalidToken, BadRequest) as exc:
            if not _drafts_refused(exc):
                raise
            _turn_drafts_off(self.bot)
            self.draft_ids.pop(index, None)
            log.warning("telegram_drafts_unavailable", error=str(exc),
                        fallback="sendMessage+editMessageText")
            raise _DraftsUnavailable from exc

    async def _post(self, index: int, text: str, mode: str | None) -> None:
        sent: Message | None = await _mapped(lambda: self.bot.send_message(
            self.chat, text, parse_mode=mode, message_thread_id=self.thread,
            reply_parameters=self._reply_params(index)))
        if sent is not None:
            self.ids[index] = sent.message_id

    async def discard(self, index: int) -> None:
        self.texts.pop(index, None)
        self.draft_ids.pop(index, None)
        mid = self.ids.pop(index, None)
        if mid is not None:
            await _mapped(lambda: self.bot.delete_message(self.chat, mid))


def stream_for(bot: Bot, message: OutboundMessage, *, private: bool) -> Any:
    """The sender for one streamed reply (drafts in private chats when supported)."""
    return TelegramStream(bot, message,
                          draft=private and drafts_supported() and not _drafts_off(bot))
