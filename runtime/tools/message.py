"""The ``message`` tool: send a message to a channel peer (``{channel, to, text}``)."""

from __future__ import annotations

from typing import Any

from runtime.tools.registry import Tool, ToolContext, ToolError, object_schema, require_str


async def message_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    channel = require_str(args, "channel")
    to = require_str(args, "to")
    text = require_str(args, "text")
    if ctx.send_message is None:
        raise ToolError("messaging is not available in this gateway")
    return await ctx.send_message(channel, to, text)


MESSAGE_TOOL = Tool(
    "message",
    "Send a message to someone on a channel (e.g. channel 'telegram', to '42'). Use it only "
    "to reach a different chat; your reply to this conversation is delivered automatically.",
    object_schema({"channel": {"type": "string"}, "to": {"type": "string"},
                   "text": {"type": "string"}}, ["channel", "to", "text"]),
    message_tool,
)
