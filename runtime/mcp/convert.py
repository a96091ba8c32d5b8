"""MCP ``CallToolResult`` -> tool result text: text parts as they are, structured content
as JSON, images/audio/resources described (their bytes are not put into the context),
capped at ``tools.mcp.max_result_chars``."""

from __future__ import annotations

import base64
import json
from typing import Any

from mcp import types


def _part(item: Any) -> str:
    if isinstance(item, types.TextContent):
        return item.text
    if isinstance(item, (types.ImageContent, types.AudioContent)):
        size = len(base64.b64decode(item.data or "", validate=False)) if item.data else 0
        return f"[{item.type}: {item.mimeType}, {size} bytes]"
    if isinstance(item, types.EmbeddedResource):
        res = item.resource
        if isinstance(res, types.TextResourceContents):
            return f"[resource {res.uri}]\n{res.text}"
        return f"[resource {res.uri}: {res.mimeType or 'binary'}]"
    if isinstance(item, types.ResourceLink):
        return f"[resource link {item.uri}: {item.name}]"
    return f"[{getattr(item, 'type', 'content')}]"


def result_text(result: types.CallToolResult, max_chars: int) -> str:
    """The text for the model (structured content appended as JSON when the server sent
    no text for it). The caller raises for ``result.isError``."""
    parts = [_part(c) for c in result.content]
    if result.structuredContent is not None and not any(
            isinstance(c, types.TextContent) for c in result.content):
        parts.append(json.dumps(result.structuredContent, ensure_ascii=False))
    text = "\n".join(p for p in parts if p) or "(no output)"
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[... {len(text) - max_chars} more characters cut ...]"
    return text
