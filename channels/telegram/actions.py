"""Telegram actions for the channel tools (runtime/tools/channel.py): ``react``
(``setMessageReaction``) and ``pin`` (``pinChatMessage``), through python-telegram-bot.

Source: https://core.telegram.org/bots/api#setmessagereaction,
https://core.telegram.org/bots/api#pinchatmessage
"""

from __future__ import annotations

from typing import Any

from telegram import Bot
from telegram.error import TelegramError


async def run_action(bot: Bot, action: str, chat_id: str, args: dict[str, Any]) -> str:
    """Run ``action`` on message ``args["message_id"]`` in ``chat_id``. Raises
    RuntimeError with Telegram's description, or for an action Telegram does not have."""
    try:
        message_id = int(str(args["message_id"]).rsplit(":", 1)[-1])
    except ValueError:
        raise RuntimeError(f"not a Telegram message id: {args['message_id']!r}") from None
    try:
        if action == "react":
            emoji = str(args["emoji"])
            await bot.set_message_reaction(chat_id=chat_id, message_id=message_id,
                                           reaction=emoji)
            return f"reacted {emoji} to {message_id}"
        if action == "pin":
            await bot.pin_chat_message(chat_id=chat_id, message_id=message_id,
                                       disable_notification=True)
            return f"pinned {message_id}"
    except TelegramError as exc:
        raise RuntimeError(str(exc)) from None
    raise RuntimeError(f"telegram has no {action}")
