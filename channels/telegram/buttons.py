"""Inline keyboards on Telegram (Bot API: InlineKeyboardMarkup, CallbackQuery): sending a
message with buttons, taking a press (a ``callback_query`` update) as a
:class:`channels.base.ButtonPress`, and removing the buttons once answered.

A press is always answered (``answerCallbackQuery``): the gateway's short reply, or an
empty answer when nobody handles it, so the presser's client stops its spinner.
"""

from __future__ import annotations

from typing import Any

from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup
from telegram.error import BadRequest, TelegramError

from channels.base import Button, ButtonPress
from channels.telegram.send import chat_id


async def send_buttons(bot: Bot, to: str, text: str, buttons: list[Button]) -> str:
    """``sendMessage`` of plain ``text`` with one row of ``buttons``; the message id.
    Raises RuntimeError when Telegram refuses."""
    markup = InlineKeyboardMarkup([[InlineKeyboardButton(b.label, callback_data=b.action)
                                    for b in buttons]])
    try:
        msg = await bot.send_message(chat_id(to), text[:4000], reply_markup=markup)
    except TelegramError as exc:
        raise RuntimeError(f"telegram refused the buttons message: {exc}") from exc
    return str(msg.message_id)


async def close_buttons(bot: Bot, to: str, message_id: str, text: str) -> None:
    """Remove the keyboard (``editMessageReplyMarkup`` without markup), then show ``text``
    (``editMessageText``). Raises RuntimeError when Telegram refuses."""
    try:
        await bot.edit_message_reply_markup(chat_id(to), int(message_id), reply_markup=None)
        await bot.edit_message_text(text[:4000], chat_id(to), int(message_id))
    except BadRequest as exc:
        if "not modified" not in str(exc).lower():
            raise RuntimeError(f"telegram refused the edit: {exc}") from exc
    except TelegramError as exc:
        raise RuntimeError(f"telegram refused the edit: {exc}") from exc


async def dispatch_press(channel: Any, raw: dict[str, Any]) -> None:
    """Hand a ``callback_query`` update to ``channel.on_press`` (always answered)."""
    query = raw["callback_query"]
    bot: Bot = channel._bot
    qid = str(query["id"])
    sender = query.get("from") or {}
    message = query.get("message") or {}
    answered = False

    async def answer(text: str) -> None:
        nonlocal answered
        if not answered:
            answered = True
            await bot.answer_callback_query(qid, text=text[:200] or None)

    sid = sender.get("id")
    # Telegram user ids are integers: anything else (a forged "1001 ") presses for nobody
    sender_id = str(sid) if isinstance(sid, int) and not isinstance(sid, bool) else ""
    press = ButtonPress(
        channel="telegram", action=str(query.get("data") or ""),
        sender_id=sender_id, account_id=channel.account_id,
        sender_name=sender.get("username") or sender.get("first_name"),
        to=str((message.get("chat") or {}).get("id", "")),
        message_id=str(message["message_id"]) if "message_id" in message else None,
        answer=answer)
    handler = getattr(channel, "on_press", None)
    try:
        if handler is not None:
            await handler(press)
    finally:
        if not answered:
            await answer("")
