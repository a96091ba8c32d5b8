"""Config model of ``channels.discord`` (and ``channels.discord.accounts.<id>``).

Registered with the channel's plugin (``channels/discord/plugin.py``); the shared access,
streaming and account-inheritance pieces come from ``channels/config.py``.
"""

from typing import Any

from pydantic import Field

from channels.config import AccessConfig, IdStr, LiveChatConfig, PlatformSection
from runtime.config_types import Duration


class DiscordAccount(AccessConfig, LiveChatConfig):
    enabled: bool = Field(
        True,
        description="Connect this account.")
    token: str | None = Field(
        None,
        description=("The bot token from the Developer Portal (keep it in the environment: "
                     "${DISCORD_BOT_TOKEN})."))
    api_base_url: str = Field(
        "https://discord.com/api/v10",
        description="Discord REST base URL (only for a proxy or tests).")
    gateway_url: str | None = Field(
        None,
        description="Discord gateway WebSocket URL; null = Discord's (set only for a proxy or tests).")
    message_content_intent: bool = Field(
        True,
        description="request the message content intent; must match the switch in the Developer Portal (off: only DMs, mentions and replies carry text).")
    send_timeout: Duration = Field(
        30.0,
        description="Timeout of each message part.")
    unhealthy_after: Duration = Field(
        120.0,
        description=("Cannot receive this long: one ERROR with the likely cause, status.problems, "
                     "/readyz 503."))
    native_commands: bool = Field(
        True,
        description=("register the chat commands as slash commands (app_commands), answered "
                     "ephemerally."))  # register the chat commands as application commands
    guild_ids: list[IdStr] = Field(
        [],
        description=("register them in these servers (instant, not in DMs); [] = globally (servers"
                     " + DMs)"))  # sync there (instant), else global
    reply_in_thread: bool = Field(
        False,
        description=("true: a top-level channel mention is answered in a new thread started from "
                     "it (needs Create Public Threads)"))  # a top-level guild mention is answered in a new thread


def _discord_problems(acc: Any) -> list[str]:
    return [] if acc.token else ["token: required when discord is enabled"]


class DiscordChannelConfig(PlatformSection, DiscordAccount):
    enabled: bool = Field(False, description="connect this platform (its accounts, or the one account of the section itself).")
    accounts: dict[str, DiscordAccount] = Field(
        {},
        description=("Several bots: {<account_id>: {token: ..., any key above}}; each inherits the"
                     " keys it does not set."))
    _problems = staticmethod(_discord_problems)
