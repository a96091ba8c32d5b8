"""Config model of ``channels.telegram`` (and ``channels.telegram.accounts.<id>``).

Registered with the channel's plugin (``channels/telegram/plugin.py``); the shared access,
streaming and account-inheritance pieces come from ``channels/config.py``.
"""

import re
from typing import Any, Literal

from pydantic import Field

from channels.config import AccessConfig, LiveChatConfig, PlatformSection
from runtime.config_types import Duration


class TelegramAccount(AccessConfig, LiveChatConfig):
    enabled: bool = Field(
        True,
        description="Connect this account.")
    token: str | None = Field(
        None,
        description=("The bot token from BotFather (keep it in the environment: "
                     "${TELEGRAM_BOT_TOKEN})."))
    api_base_url: str = Field(
        "https://api.telegram.org/bot",
        description="Bot API base URL; the token is appended (only for a proxy or tests).")
    api_file_url: str | None = Field(
        None,
        description="Base URL for file downloads; null = derived from api_base_url.")
    mode: Literal["polling", "webhook"] = Field(
        "polling",
        description="polling (long-poll getUpdates, no public URL) | webhook (Telegram calls webhook_url).")
    webhook_secret: str | None = Field(
        None,
        description="webhook: checked against X-Telegram-Bot-Api-Secret-Token.")
    webhook_path: str = Field(
        "/telegram/webhook",
        description="Webhook mode: the path mounted on the gateway's HTTP server.")
    webhook_url: str | None = Field(
        None,
        description="webhook: public URL registered with setWebhook.")
    poll_timeout: Duration = Field(
        30.0,
        description="Polling: long-poll wait of each getUpdates call.")
    send_timeout: Duration = Field(
        30.0,
        description="HTTP timeout of each send.")
    unhealthy_after: Duration = Field(
        120.0,
        description=("cannot receive this long: one ERROR with the likely cause, status.problems, "
                     "/readyz 503."))  # cannot receive this long: ERROR, problem, /readyz 503


def _telegram_problems(acc: Any) -> list[str]:
    out = [] if acc.token else ["token: required when telegram is enabled"]
    if acc.mode == "webhook" and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}",
                                                  acc.webhook_secret or ""):
        out.append("webhook_secret: required for mode webhook: 1-256 characters of "
                   "A-Z a-z 0-9 _ - (Telegram's rule)")
    return out


class TelegramChannelConfig(PlatformSection, TelegramAccount):
    enabled: bool = Field(False, description="connect this platform (its accounts, or the one account of the section itself).")
    accounts: dict[str, TelegramAccount] = Field(
        {},
        description="several bots: {<account_id>: {token: ..., any key above}}.")
    _problems = staticmethod(_telegram_problems)
