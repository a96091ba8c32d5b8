"""Extended thinking in the fake Anthropic server, checked and produced the way the Messages
API does it (Anthropic docs: "Building with extended thinking").

Requests (each problem is the API's 400 message):

- ``thinking``: ``{"type": "disabled"}`` or ``{"type": "enabled", "budget_tokens": N}`` with
  1024 <= N < ``max_tokens``; with thinking enabled ``temperature`` may only be 1.
- ``thinking`` / ``redacted_thinking`` blocks only in assistant messages; a ``thinking``
  block needs its ``signature`` unchanged (the fake signs what it sends: a sha256 of the
  text), a ``redacted_thinking`` block its ``data``.
- With thinking enabled, a request that continues a tool loop (its last user message holds
  ``tool_result`` blocks) needs the assistant message before it to start with a thinking
  block. Older assistant messages may omit theirs.

Responses: with thinking enabled every message starts with one ``thinking`` block (the
script item's ``"thinking"`` text, else a default), streamed as ``thinking_delta`` events
followed by one ``signature_delta``.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

MIN_BUDGET = 1024
BLOCK_TYPES = ("thinking", "redacted_thinking")
DEFAULT_THINKING = "Weighing the request step by step before answering."
_DOCS = "Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"


def sign(thinking: str) -> str:
    """The fake's signature of a thinking text (opaque to the client)."""
    digest = hashlib.sha256(b"fake-anthropic-thinking\0" + thinking.encode()).digest()
    return base64.b64encode(digest).decode()


def enabled(body: dict[str, Any]) -> bool:
    cfg = body.get("thinking")
    return isinstance(cfg, dict) and cfg.get("type") == "enabled"


def thinking_block(item: dict[str, Any]) -> dict[str, Any]:
    """The thinking block a response starts with (thinking enabled)."""
    text = item.get("thinking") or DEFAULT_THINKING
    return {"type": "thinking", "thinking": text, "signature": sign(text)}


def validate_params(body: dict[str, Any]) -> str | None:
    """The ``thinking`` parameter and what it rules out; None if valid."""
    cfg = body.get("thinking")
    if cfg is None:
        return None
    kind = cfg.get("type") if isinstance(cfg, dict) else None
    if kind == "disabled":
        return None
    if kind != "enabled":
        return (f"thinking.type: Input tag {kind!r} found using 'type' does not match any of "
                "the expected tags: 'enabled', 'disabled'")
    budget = cfg.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool):
        return "thinking.enabled.budget_tokens: Field required"
    if budget < MIN_BUDGET:
        return (f"thinking.enabled.budget_tokens: Input should be greater than or equal to "
                f"{MIN_BUDGET}")
    if budget >= body.get("max_tokens", 0):
        return f"`max_tokens` must be greater than `thinking.budget_tokens`. {_DOCS}"
    if body.get("temperature", 1) != 1:
        return f"`temperature` may only be set to 1 when thinking is enabled. {_DOCS}"
    return None


def validate_block(block: dict[str, Any], role: str, where: str) -> str | None:
    """One ``thinking``/``redacted_thinking`` content block of a request message."""
    if role != "assistant":
        return f"{where}: {block['type']} blocks are only allowed in assistant messages"
    if block["type"] == "redacted_thinking":
        return None if isinstance(block.get("data"), str) and block["data"] else (
            f"{where}.data: Field required")
    text, signature = block.get("thinking"), block.get("signature")
    if not isinstance(text, str) or not isinstance(signature, str):
        return f"{where}: thinking blocks need `thinking` and `signature`"
    if signature != sign(text):
        return f"{where}: Invalid `signature` in `thinking` block"
    return None


def validate_tool_loop(body: dict[str, Any]) -> str | None:
    """With thinking enabled, the tool loop's assistant message must start with a thinking
    block; None when the request is fine."""
    messages = body.get("messages") or []
    if not enabled(body) or len(messages) < 2:
        return None
    last = messages[-1]
    content = last.get("content")
    if last.get("role") != "user" or not isinstance(content, list) or not any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
        return None
    i = len(messages) - 2
    previous = messages[i].get("content")
    first = previous[0] if isinstance(previous, list) and previous else None
    found = first.get("type") if isinstance(first, dict) else "text"
    if found in BLOCK_TYPES:
        return None
    return (f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
            f"found `{found}`. When `thinking` is enabled, a final `assistant` message must "
            "start with a thinking block (preceeding the lastmost set of `tool_use` and "
            "`tool_result` blocks). We recommend you include thinking blocks from previous "
            f"turns. To avoid this requirement, disable `thinking`. {_DOCS}")
