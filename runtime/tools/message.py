"""The ``message`` tool: send a message, files or both (``{channel?, to?, text?, media?}``).

``media`` lists workspace paths (confined like the file tools) or https URLs (fetched
through the web fetch guard into the workspace ``downloads/``); the platform's size limit is
checked before anything is sent. Without ``channel``/``to`` it goes to this conversation.
``channel`` is ``telegram`` or ``telegram:<account>`` (a named account of a multi-account
platform); ``to`` is the chat id, optionally ``<chat>:<thread>``.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

from runtime.tools.file_taint import note_file_taint, real_rel
from runtime.tools.registry import ToolContext, ToolError


async def message_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    channel, to = args.get("channel"), args.get("to")
    text = args.get("text") or ""
    media = args.get("media") or []
    if not isinstance(text, str) or not isinstance(media, list) or not all(
            isinstance(m, str) and m for m in media):
        raise ToolError("'text' must be a string and 'media' a list of paths or URLs")
    if not text and not media:
        raise ToolError("give 'text', 'media' or both")
    if bool(channel) != bool(to):
        raise ToolError("give both 'channel' and 'to', or neither (this conversation)")
    if ctx.send_message is None:
        raise ToolError("messaging is not available in this gateway")
    for item in media:  # attaching a file a stranger sent brings it into the turn
        if not item.startswith(("http://", "https://")) and not os.path.isabs(item):
            # by the path given, and by where a symlink leads (its bytes: a copy)
            note_file_taint(ctx, posixpath.normpath(item))
            real = real_rel(ctx.workspace, item)
            if real is not None and real != posixpath.normpath(item):
                note_file_taint(ctx, real)
    if media or not channel:
        return await ctx.send_message(channel or "", to or "", text, media=media,
                                      session_key=ctx.session_key)
    return await ctx.send_message(channel, to, text)
