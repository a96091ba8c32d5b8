"""Slack actions for the channel tools (runtime/tools/channel.py): ``react``
(``reactions.add``) and ``pin`` (``pins.add``) on a message of the conversation.

Source: https://api.slack.com/methods/reactions.add, https://api.slack.com/methods/pins.add
"""

from __future__ import annotations

from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.reactions import slack_emoji_name


async def run_action(web: AsyncWebClient, action: str, channel: str,
                     args: dict[str, Any]) -> str:
    """Run ``action`` on message ``args["message_id"]`` (its ``ts``) in ``channel``.
    Raises RuntimeError with Slack's error code, or for an action Slack does not have."""
    ts = str(args["message_id"]).rsplit(":", 1)[-1]  # inbound ids are "<channel>:<ts>"
    try:
        if action == "react":
            name = slack_emoji_name(str(args["emoji"]))
            await web.reactions_add(channel=channel, timestamp=ts, name=name)
            return f"reacted :{name}: to {ts}"
        if action == "pin":
            await web.pins_add(channel=channel, timestamp=ts)
            return f"pinned {ts}"
    except SlackApiError as exc:
        raise RuntimeError(str(exc.response.get("error") or exc)) from None
    raise RuntimeError(f"slack has no {action}")
