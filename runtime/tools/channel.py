"""Channel tools (seed 001 §3 source 5): actions on the chat the turn came from. They
exist only in turns from their platforms (``Tool.platforms``): ``react`` and ``pin`` on
Slack, Discord and Telegram, ``thread_create`` on Discord.

``message_id`` defaults to the message being answered. The gateway puts a callable
``channel_action(scope, action, args) -> Awaitable[str]`` in
``ToolContext.extra["channel_action"]``; it runs the action through the adapter of the
turn's channel account (raising ``RuntimeError`` when the adapter cannot do it).
"""

from __future__ import annotations

from typing import Any

from runtime.tools.registry import ToolContext, ToolError, require_str


async def _act(action: str, args: dict[str, Any], ctx: ToolContext) -> str:
    scope = ctx.scope
    run = ctx.extra.get("channel_action")
    if scope is None or scope.route is None or run is None:
        raise ToolError(f"{action} needs a chat to act on (this turn has none)")
    message_id = args.get("message_id") or scope.message_id
    if action != "thread_create" and not message_id:
        raise ToolError("argument 'message_id' is required (no message is being answered)")
    try:
        return await run(scope, action, {**args, "message_id": message_id})
    except (RuntimeError, ValueError) as exc:
        raise ToolError(f"{action} failed: {exc}") from None


async def react_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    require_str(args, "emoji")
    return await _act("react", args, ctx)


async def pin_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    return await _act("pin", args, ctx)


async def thread_create_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    require_str(args, "name")
    return await _act("thread_create", args, ctx)
