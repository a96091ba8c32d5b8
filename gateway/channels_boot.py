"""Creating and starting the platform channel adapters configured under ``channels.*``.

Each account of each enabled platform becomes one adapter instance. Adapters are created
before the HTTP server starts (so webhook routes can be mounted) and started after it. A
channel that fails to start is logged and reported in status; it never takes the gateway
or the other channels down.
"""

from __future__ import annotations

import importlib
from typing import Any

import structlog

from channels.base import Channel
from channels.config import account_configs

log = structlog.get_logger(__name__)

ADAPTERS = {
    "telegram": ("channels.telegram_adapter", "TelegramChannel"),
    "slack": ("channels.slack_adapter", "SlackChannel"),
    "discord": ("channels.discord_adapter", "DiscordChannel"),
}


def create_channels(gw: Any) -> list[Channel]:
    out: list[Channel] = []
    for name, (module, cls_name) in ADAPTERS.items():
        section = getattr(gw.config.channels, name)
        accounts = account_configs(section)
        if not accounts:
            continue
        cls = getattr(importlib.import_module(module), cls_name)
        for account_id, acc in accounts.items():
            ch = cls(account_id, acc, clock=gw.clock)
            gw.deliverer.register(ch)
            out.append(ch)
    return out


async def start_channels(gw: Any) -> None:
    for ch in gw.channels:
        try:
            await ch.start(gw.intake.on_message, gw.intake.on_event)
            log.info("channel_started", channel=ch.name, account=ch.account_id,
                     state=ch.state)
        except Exception as exc:  # noqa: BLE001 - one channel must not stop the gateway
            log.error("channel_start_failed", channel=ch.name, account=ch.account_id,
                      error=str(exc))
            gw.problems.append(f"channel {ch.name}:{ch.account_id} failed to start: {exc}")
