"""Transcript ``message`` entries <-> model messages: the builders a turn writes with
(``user_message``, ``assistant_message``, ``tool_result_message``) and
``message_from_entry``, which reads one back as a ``ChatMessage`` (DESIGN.md transcript
format)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from runtime.providers.base import ChatMessage, ToolCall

if TYPE_CHECKING:
    from runtime.media.ref import MediaRef

log = structlog.get_logger(__name__)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and part.get("type") == "text")
    return ""


def _media_of(content: Any) -> list[MediaRef]:
    """The ``{"type": "media", ...}`` references of a user message (bad ones skipped)."""
    if not isinstance(content, list):
        return []
    refs = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "media":
            from runtime.media.ref import MediaRef  # loads with the first stored file
            try:
                refs.append(MediaRef.from_dict(part))
            except (KeyError, TypeError, ValueError):
                log.warning("transcript_media_ref_invalid", part=str(part)[:200])
    return refs


def message_from_entry(entry: dict[str, Any]) -> ChatMessage | None:
    """Model message of a transcript ``message`` entry (None for other entry types)."""
    if entry.get("type") != "message":
        return None
    m = entry.get("message") or {}
    role = m.get("role")
    if role == "user":
        return ChatMessage(role="user", content=_text_of(m.get("content")),
                           media=_media_of(m.get("content")))
    if role == "assistant":
        calls = [ToolCall(id=str(p.get("id")), name=str(p.get("name")),
                          arguments=p.get("arguments") or {})
                 for p in m.get("content") or [] if isinstance(p, dict)
                 and p.get("type") == "toolCall"]
        return ChatMessage(role="assistant", content=_text_of(m.get("content")), tool_calls=calls)
    if role == "toolResult":
        return ChatMessage(role="tool", content=_text_of(m.get("content")),
                           tool_call_id=str(m.get("toolCallId")), name=m.get("toolName"),
                           is_error=bool(m.get("isError")), for_sender=m.get("forSender"))
    return None


def user_message(text: str, ts_ms: int, media: list[MediaRef] | None = None,
                 **extra: Any) -> dict[str, Any]:
    """A transcript user message; ``media`` become ``{"type": "media", path, mime, size,
    sha256, name, kind}`` parts (references, never bytes)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    content += [{"type": "media", **ref.to_dict()} for ref in media or ()]
    return {"role": "user", "content": content, "timestamp": ts_ms, **extra}


def assistant_message(text: str, tool_calls: list[ToolCall], ts_ms: int,
                      **extra: Any) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text:
        content.append({"type": "text", "text": text})
    content += [{"type": "toolCall", "id": c.id, "name": c.name, "arguments": c.arguments}
                for c in tool_calls]
    return {"role": "assistant", "content": content, "timestamp": ts_ms, **extra}


def tool_result_message(call: ToolCall, text: str, is_error: bool, ts_ms: int,
                        **extra: Any) -> dict[str, Any]:
    return {"role": "toolResult", "toolCallId": call.id, "toolName": call.name,
            "content": [{"type": "text", "text": text}], "isError": is_error,
            "timestamp": ts_ms, **extra}


MEMORY_TOOLS = frozenset({"memory_search", "memory_get"})
"""Tools whose results show a person's memory (their own scope, their DM transcripts)."""
OMITTED = "[memory result for another member omitted]"


def memory_owner(tool: str, asker: Any) -> dict[str, Any]:
    """The ``forSender`` extra of a tool result entry: ``{"forSender": <canonical id>}``
    for a memory tool's result in a turn of a chat sender (``asker``: runtime.memory.
    scopes.Asker or None), else ``{}``."""
    user = getattr(asker, "user", None)
    return {"forSender": user} if tool in MEMORY_TOOLS and user else {}


def private_view(messages: list[ChatMessage], asker: Any) -> list[ChatMessage]:
    """``messages`` as the turn of ``asker`` may see them: a memory tool result recorded
    for another sender (``for_sender``) becomes :data:`OMITTED` (a copy; the transcript
    keeps the result). The list itself when nothing is hidden."""
    user = getattr(asker, "user", None)
    mine = {user, *getattr(asker, "aliases", ())}  # a linked id's older results are theirs
    if not any(m.for_sender and m.for_sender not in mine for m in messages):
        return messages
    return [replace(m, content=OMITTED) if m.for_sender and m.for_sender not in mine else m
            for m in messages]
