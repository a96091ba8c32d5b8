"""Outbound Telegram: one ``OutboundMessage`` -> ``sendMessage`` calls (python-telegram-bot).

Maps the Bot API's answers onto the shared send loop (channels/outbound/delivery.py): a 400 "can't
parse entities" (PTB lower-cases descriptions after the first letter, so matched
case-insensitively) -> MarkupRejected (the part is resent plain); 429 ``RetryAfter`` ->
RateLimited(retry_after seconds); ``ChatMigrated`` (a group upgraded to a supergroup) ->
the part is resent to the new chat id once; network errors, timeouts and 5xx stay
``NetworkError``/``TimedOut`` (retryable per ``is_retryable``); other ``BadRequest`` /
``Forbidden`` are final. Bot API: sendMessage, ReplyParameters, message_thread_id.
"""

from __future__ import annotations

import asyncio
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from telegram import Bot, InputFile, ReplyParameters
from telegram.constants import ChatAction, ParseMode
from telegram.error import (
    BadRequest,
    ChatMigrated,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)
from telegram.warnings import PTBDeprecationWarning

from channels.base import DeliveryResult, OutboundMessage
from channels.media.outbound import files_failed, upload_kind, upload_problem
from channels.outbound.delivery import MarkupRejected, RateLimited, send_chunks
from channels.outbound.render import render_chunks
from runtime.clock import Clock


def retry_after_seconds(exc: RetryAfter) -> float:
    """``RetryAfter.retry_after`` in seconds (an int in PTB 22, a timedelta later; the
    property warns about that change, which we have handled)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = exc.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def chat_id(value: str) -> int | str:
    """Numeric chat ids as int; ``@channelusername`` stays a string."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


async def send_outbound(bot: Bot, message: OutboundMessage, *, clock: Clock,
                        log: Any) -> DeliveryResult:
    """Send ``message.text`` (model Markdown) as Telegram-HTML parts (<= 4096 UTF-16 units
    each, channels/outbound/render.py) to chat ``message.to``, forum topic ``thread_id``; the first
    part (every part when ``reply_to_all``) carries ``reply_parameters`` for ``reply_to`` (with
    allow_sending_without_reply, so a deleted original does not fail the send).

    Returns the ChunkDeliveryResult of ``send_chunks``; a non-numeric ``thread_id`` gives
    ok=False, retryable=False without any call. ``log`` is a bound structlog logger.
    """
    try:
        thread = int(message.thread_id) if message.thread_id else None
    except ValueError:
        log.warning("telegram_send_failed", to=message.to, reason="bad thread_id",
                    thread_id=message.thread_id)
        return DeliveryResult(ok=False, retryable=False,
                              error=f"thread_id {message.thread_id!r} is not a topic id")
    # reply_to is a nicety: a non-numeric one is dropped rather than failing the send
    reply = int(message.reply_to) if message.reply_to and message.reply_to.isdigit() \
        else None
    send_part = _PartSender(bot, chat_id(message.to), thread, reply,
                            reply_to_all=message.reply_to_all, log=log)
    problems = [p for p in (upload_problem("telegram", Path(f)) for f in message.media) if p]
    if problems:  # checked before anything is sent: the model gets the reason
        return DeliveryResult(ok=False, retryable=False, error="; ".join(problems))
    result = DeliveryResult(ok=True)
    if message.text.strip():
        chunks = render_chunks(message.text, "telegram")
        result = await send_chunks(chunks, send_part, clock=clock)
    if result.ok and message.media:
        result = await _send_files(bot, send_part.chat, thread, message.media, result)
    if not result.ok:
        log.warning("telegram_send_failed", to=message.to, thread_id=message.thread_id,
                    error=result.error, retryable=result.retryable,
                    parts_sent=len(result.message_ids))
    return result


class _PartSender:
    """``await send_part(text, formatted) -> message id`` for ``send_chunks``: one
    sendMessage to ``chat`` (followed to its new id once when the group became a
    supergroup), replying to ``reply`` on the first part (every part with
    ``reply_to_all``). Raises MarkupRejected when Telegram cannot parse the HTML,
    RateLimited on 429, other TelegramErrors as they come."""

    def __init__(self, bot: Bot, chat: int | str, thread: int | None, reply: int | None, *,
                 reply_to_all: bool, log: Any) -> None:
        self.bot, self.chat, self.thread, self.reply = bot, chat, thread, reply
        self.reply_to_all, self.log = reply_to_all, log
        self.sent_any = False

    async def __call__(self, text: str, formatted: bool) -> str:
        reply = self.reply
        params: dict[str, Any] = {
            "parse_mode": ParseMode.HTML if formatted else None,
            "message_thread_id": self.thread,
            "reply_parameters": ReplyParameters(reply, allow_sending_without_reply=True)
            if reply is not None and (self.reply_to_all or not self.sent_any) else None,
        }
        try:
            try:
                sent = await self.bot.send_message(self.chat, text, **params)
            except ChatMigrated as exc:
                self.log.warning("telegram_chat_migrated", old_chat_id=str(self.chat),
                                 new_chat_id=str(exc.new_chat_id))
                self.chat = exc.new_chat_id
                sent = await self.bot.send_message(self.chat, text, **params)
        except BadRequest as exc:
            if "can't parse entities" in str(exc).lower():
                raise MarkupRejected(str(exc)) from exc
            raise
        except RetryAfter as exc:
            raise RateLimited(retry_after_seconds(exc)) from exc
        self.sent_any = True
        return str(sent.message_id)


async def _send_files(bot: Bot, chat: int | str, thread: int | None, files: list[str],
                      result: DeliveryResult) -> DeliveryResult:
    """Native uploads: sendPhoto for images, sendVoice for Ogg/Opus, sendDocument else.
    The first failure stops the rest (ok=False, retryable for network errors)."""
    for i, name in enumerate(files):
        path = Path(name)
        kind, _ = upload_kind(path)
        method = {"photo": bot.send_photo, "voice": bot.send_voice}.get(kind, bot.send_document)
        field = {"photo": "photo", "voice": "voice"}.get(kind, "document")
        try:
            data = await asyncio.to_thread(path.read_bytes)  # <= 50 MB, checked before
            sent = await method(chat, **{field: InputFile(data, filename=path.name)},
                                message_thread_id=thread)
        except RetryAfter as exc:
            return files_failed(result.message_ids, files[i:], retryable=True,
                                error=f"rate limited, retry after {retry_after_seconds(exc)}s")
        except TelegramError as exc:
            return files_failed(result.message_ids, files[i:], error=f"{field} {path.name}: {exc}",
                                retryable=isinstance(exc, (NetworkError, TimedOut)))
        result.message_ids.append(str(sent.message_id))
    return result


async def send_typing(bot: Bot, to: str, thread_id: str | None, *, log: Any) -> None:
    """One ``sendChatAction typing`` (clients show it ~5 s); any error is logged at debug
    and swallowed (typing is cosmetic)."""
    try:
        await bot.send_chat_action(chat_id(to), ChatAction.TYPING,
                                   message_thread_id=int(thread_id) if thread_id else None)
    except Exception as exc:  # noqa: BLE001 - typing is cosmetic
        log.debug("telegram_typing_failed", to=to, error=f"{type(exc).__name__}: {exc}")
