"""Slack as a channel plugin (entry point ``slack`` of ``tidegate.channels``).

Imports only the config model; the adapter (slack-bolt) is imported when an account is
created.
"""

from __future__ import annotations

from typing import Any

from channels.sdk import Capabilities, ChannelContext, ChannelPlugin, SetupField
from channels.slack.config import SlackChannelConfig


async def probe(account: Any, timeout: float) -> tuple[bool, str]:
    """``auth.test`` with the bot token (channels/slack/probe.py)."""
    from channels.slack.probe import probe as auth_test
    return await auth_test(account, timeout)


def create(account_id: str, config: Any, context: ChannelContext) -> Any:
    """A ``SlackChannel`` for one account. Raises ValueError for missing tokens."""
    from channels.slack.adapter import SlackChannel
    return SlackChannel(account_id, config, clock=context.clock, media=context.media)


PLUGIN = ChannelPlugin(
    name="slack", config=SlackChannelConfig, create=create,
    description="The Slack app (Socket Mode or the HTTP Events API; several under accounts).",
    capabilities=Capabilities(threads=True, edits=True, drafts=True, reactions=True,
                              files=True, buttons=True, markup="slack", text_limit=4000),
    case_insensitive_ids=True, probe=probe,
    setup=(SetupField("bot_token", "slack bot token (xoxb-...)", secret=True,
                      env="SLACK_BOT_TOKEN"),
           SetupField("app_token", "slack app-level token for Socket Mode (xapp-...)",
                      secret=True, env="SLACK_APP_TOKEN"),
           SetupField("api_base_url", "Web API base URL", advanced=True)))
