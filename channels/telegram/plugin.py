"""Telegram as a channel plugin (entry point ``telegram`` of ``tidegate.channels``).

Imports only the config model; the adapter (python-telegram-bot) is imported when an
account is created.
"""

from __future__ import annotations

from typing import Any

from channels.sdk import Capabilities, ChannelContext, ChannelPlugin, SetupField
from channels.telegram.config import TelegramChannelConfig


async def probe(account: Any, timeout: float) -> tuple[bool, str]:
    """``getMe`` with the token (channels/telegram/probe.py)."""
    from channels.telegram.probe import probe as get_me
    return await get_me(account, timeout)


def create(account_id: str, config: Any, context: ChannelContext) -> Any:
    """A ``TelegramChannel`` for one account. Raises ValueError for a missing token."""
    from channels.telegram.adapter import TelegramChannel
    return TelegramChannel(account_id, config, clock=context.clock, media=context.media)


PLUGIN = ChannelPlugin(
    name="telegram", config=TelegramChannelConfig, create=create,
    description="The Telegram bot (one token; several under accounts).",
    capabilities=Capabilities(threads=True, edits=True, drafts=True, reactions=True,
                              files=True, buttons=True, markup="telegram", text_limit=4096),
    case_insensitive_ids=True, probe=probe,
    setup=(SetupField("token", "telegram bot token (from @BotFather)", secret=True,
                      env="TELEGRAM_BOT_TOKEN"),
           SetupField("api_base_url", "Bot API base URL", advanced=True)))
