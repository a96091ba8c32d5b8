"""Reading Anthropic Messages responses: the content blocks of a message (non-streamed)
and the events of a stream (https://docs.anthropic.com/en/api/messages-streaming:
``text_delta``, ``input_json_delta``, ``thinking_delta``, ``signature_delta``) into the parts
of a ``ModelResponse``; the usage mapping described in runtime/providers/anthropic_provider.py.
Thinking blocks are kept as the wire dicts to send back unchanged, apart from the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.providers.base import ToolCall, Usage

THINKING_TYPES = ("thinking", "redacted_thinking")


def read_content(blocks: Any) -> tuple[str, list[ToolCall], list[dict[str, Any]]]:
    """A message's content blocks -> (reply text, tool calls, thinking blocks)."""
    text: list[str] = []
    calls: list[ToolCall] = []
    thinking: list[dict[str, Any]] = []
    for block in blocks:
        if block.type == "text":
            text.append(block.text)
        elif block.type == "tool_use":
            args = block.input if isinstance(block.input, dict) else {
                "_raw": str(block.input), "_error": "arguments are not a JSON object"
            }
            calls.append(ToolCall(id=block.id, name=block.name, arguments=args))
        elif block.type in THINKING_TYPES:
            thinking.append(_thinking_block(block))
    return "".join(text), calls, thinking


def _thinking_block(block: Any) -> dict[str, Any]:
    """A response's thinking block as the wire dict to send back unchanged."""
    if block.type == "redacted_thinking":
        return {"type": "redacted_thinking", "data": block.data}
    return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}


def usage_of(raw: Any, into: Usage | None = None) -> Usage:
    """Fold an SDK usage object into ``into`` (fields the event leaves out are kept)."""
    usage = into or Usage()
    if raw is None:
        return usage
    fresh = getattr(raw, "input_tokens", None)
    read = getattr(raw, "cache_read_input_tokens", None)
    write = getattr(raw, "cache_creation_input_tokens", None)
    if read is not None:
        usage.cache_read_tokens = read
    if write is not None:
        usage.cache_write_tokens = write
    if fresh is not None:
        usage.input_tokens = fresh + usage.cache_read_tokens + usage.cache_write_tokens
    output = getattr(raw, "output_tokens", None)
    if output is not None:
        usage.output_tokens = output
    return usage


@dataclass(slots=True)
class StreamAssembly:
    """A streamed message put together from its events (Messages streaming: text_delta,
    input_json_delta, thinking_delta, signature_delta)."""

    text: list[str] = field(default_factory=list)
    tools: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> tool_use
    thinking: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> block
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    stop: str | None = None
    finished: bool = False

    def feed(self, event: Any) -> str:
        """Take one stream event; returns the reply text it adds ("" for none)."""
        kind = event.type
        if kind == "message_start":
            self.model = event.message.model or ""
            self.usage = usage_of(event.message.usage, self.usage)
        elif kind == "content_block_start":
            return self._start(event.index, event.content_block)
        elif kind == "content_block_delta":
            return self._delta(event.index, event.delta)
        elif kind == "message_delta":
            self.stop = event.delta.stop_reason or self.stop
            self.usage = usage_of(event.usage, self.usage)
        elif kind == "message_stop":
            self.finished = True
        return ""

    def _start(self, index: int, block: Any) -> str:
        if block.type == "tool_use":
            self.tools[index] = {"id": block.id, "name": block.name, "json": []}
        elif block.type == "thinking":
            self.thinking[index] = {"type": "thinking",
                                    "thinking": getattr(block, "thinking", "") or "",
                                    "signature": getattr(block, "signature", "") or ""}
        elif block.type == "redacted_thinking":
            self.thinking[index] = {"type": "redacted_thinking", "data": block.data}
        elif block.type == "text" and block.text:
            self.text.append(block.text)
            return block.text
        return ""

    def _delta(self, index: int, delta: Any) -> str:
        if delta.type == "text_delta":
            self.text.append(delta.text)
            return delta.text
        if delta.type == "input_json_delta" and index in self.tools:
            self.tools[index]["json"].append(delta.partial_json)
        elif delta.type == "thinking_delta" and index in self.thinking:
            self.thinking[index]["thinking"] += delta.thinking
        elif delta.type == "signature_delta" and index in self.thinking:
            self.thinking[index]["signature"] = delta.signature
        return ""
