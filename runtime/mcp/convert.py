"""MCP ``CallToolResult`` -> tool result text: text parts as they are, structured content
as JSON, images and audio saved into the workspace ``downloads/`` (the result names the
path, so the agent can look at it or send it with ``MEDIA: <path>``; the bytes are not put
into the context), resources described, capped at ``tools.mcp.max_result_chars``."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from pathlib import Path
from typing import Any

from mcp import types

from runtime.tools.workspace_fs import write_bytes

_EXT = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp",
        "audio/wav": "wav", "audio/mpeg": "mp3", "audio/ogg": "ogg"}


def save_binary(workspace: Path | None, data_b64: str, mime: str) -> str:
    """Store base64 ``data_b64`` as ``downloads/mcp-<sha256[:12]>.<ext>``; returns the
    description line for the model."""
    try:
        data = base64.b64decode(data_b64 or "", validate=True)
    except (binascii.Error, ValueError):
        return f"[{mime}: invalid base64 data]"
    if workspace is None:
        return f"[{mime}, {len(data)} bytes]"
    rel = f"downloads/mcp-{hashlib.sha256(data).hexdigest()[:12]}.{_EXT.get(mime, 'bin')}"
    write_bytes(workspace, rel, data)  # walked from a directory fd: no link out
    return f"[{mime}, {len(data)} bytes, saved at {rel}]"


def _part(item: Any, workspace: Path | None) -> str:
    if isinstance(item, types.TextContent):
        return item.text
    if isinstance(item, (types.ImageContent, types.AudioContent)):
        return save_binary(workspace, item.data, item.mimeType)
    if isinstance(item, types.EmbeddedResource):
        res = item.resource
        if isinstance(res, types.TextResourceContents):
            return f"[resource {res.uri}]\n{res.text}"
        return f"[resource {res.uri}: {res.mimeType or 'binary'}]"
    if isinstance(item, types.ResourceLink):
        return f"[resource link {item.uri}: {item.name}]"
    return f"[{getattr(item, 'type', 'content')}]"


def result_text(result: types.CallToolResult, max_chars: int,
                workspace: Path | None = None) -> str:
    """The text for the model (structured content appended as JSON when the server sent
    no text for it). The caller raises for ``result.isError``. Blocking file writes for
    images: call it off the event loop when the result has any."""
    parts = [_part(c, workspace) for c in result.content]
    if result.structuredContent is not None and not any(
            isinstance(c, types.TextContent) for c in result.content):
        parts.append(json.dumps(result.structuredContent, ensure_ascii=False))
    text = "\n".join(p for p in parts if p) or "(no output)"
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[... {len(text) - max_chars} more characters cut ...]"
    return text
