"""Discord actions for the channel tools (runtime/tools/channel.py): ``react``
(add a reaction), ``pin`` (pin a message) and ``thread_create`` (a public thread, from a
message when one is given), through discord.py.

Source: https://discord.com/developers/docs/resources/message#create-reaction,
https://discord.com/developers/docs/resources/message#pin-message,
https://discord.com/developers/docs/resources/channel#start-thread-from-message
"""

from __future__ import annotations

from typing import Any

import discord

from channels.discord.send import DeliveryError, snowflake


async def run_action(client: discord.Client, action: str, channel_id: int,
                     args: dict[str, Any]) -> str:
    """Run ``action`` in ``channel_id``. Raises RuntimeError with Discord's message."""
    mid = args.get("message_id")
    try:
        # The cached channel carries its guild (threads need it); else a partial one.
        channel = client.get_channel(channel_id) or client.get_partial_messageable(channel_id)
        msg = channel.get_partial_message(snowflake(str(mid), "message id")) if mid else None
        if action == "react" and msg is not None:
            await msg.add_reaction(str(args["emoji"]))
            return f"reacted {args['emoji']} to {mid}"
        if action == "pin" and msg is not None:
            await msg.pin()
            return f"pinned {mid}"
        if action == "thread_create":
            name = str(args["name"])[:100]  # Discord's limit for thread names
            if msg is not None:
                thread = await msg.create_thread(name=name)
            else:
                parent = client.get_channel(channel_id) or await client.fetch_channel(channel_id)
                thread = await parent.create_thread(name=name,
                                                    type=discord.ChannelType.public_thread)
            return f"created thread {thread.name} ({thread.id})"
    except discord.HTTPException as exc:
        raise RuntimeError(f"{exc.status}: {exc.text or exc}") from None
    except (DeliveryError, ValueError, AttributeError) as exc:
        raise RuntimeError(str(exc)) from None
    raise RuntimeError(f"discord cannot {action} without a message id")
