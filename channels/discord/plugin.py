"""Discord as a channel plugin (entry point ``discord`` of ``tidegate.channels``).

Imports only the config model; the adapter (discord.py) is imported when an account is
created. The catch-up cursors live in ``channels/discord-<account>-cursors.json`` (or the
shared store on PostgreSQL), the gateway session for RESUME in ``...-resume.json``.
"""

from __future__ import annotations

from typing import Any

from channels.discord.config import DiscordChannelConfig
from channels.sdk import Capabilities, ChannelContext, ChannelPlugin, SetupField


async def probe(account: Any, timeout: float) -> tuple[bool, str]:
    """``GET /users/@me`` with the bot token (channels/discord/probe.py)."""
    from channels.discord.probe import probe as users_me
    return await users_me(account, timeout)


def create(account_id: str, config: Any, context: ChannelContext) -> Any:
    """A ``DiscordChannel`` for one account. Raises ValueError for a missing token."""
    from channels.discord.adapter import DiscordChannel
    return DiscordChannel(account_id, config, clock=context.clock, media=context.media,
                          cursor_path=context.state_path("cursors.json"),
                          cursor_records=context.records("discord_cursors",
                                                         account=account_id),
                          resume_path=context.state_path("resume.json"))


PLUGIN = ChannelPlugin(
    name="discord", config=DiscordChannelConfig, create=create,
    description="The Discord bot (gateway connection; several under accounts).",
    capabilities=Capabilities(threads=True, edits=True, reactions=True, files=True,
                              buttons=True, markup="discord", text_limit=2000),
    case_insensitive_ids=True, probe=probe,
    setup=(SetupField("token", "discord bot token", secret=True, env="DISCORD_BOT_TOKEN"),
           SetupField("api_base_url", "REST base URL", advanced=True)))
