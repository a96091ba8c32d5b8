"""Token estimates and fitting a history to the model's token budget without separating a
tool call from its result (seed 003 §5)."""

from __future__ import annotations

from runtime.providers.base import ChatMessage, ToolCall

CHARS_PER_TOKEN = 4
MEDIA_TOKENS = 1200  # an image part at 1568 px costs ~1.2-1.6k tokens on either API
MISSING_RESULT = "error: no result was recorded for this tool call (the turn was interrupted)"


def estimate_tokens(msg: ChatMessage) -> int:
    n = len(msg.content)
    for call in msg.tool_calls:
        n += len(call.name) + len(str(call.arguments))
    return n // CHARS_PER_TOKEN + 4 + MEDIA_TOKENS * len(msg.media)


def fit_to_budget(messages: list[ChatMessage], budget_tokens: int) -> list[ChatMessage]:
    """The newest messages whose estimated size fits ``budget_tokens``.

    A tool call and its result are never separated: the cut never leaves a tool result
    without its call, and a call whose result is missing (crash mid-turn) gets a synthetic
    error result so providers accept the history.
    """
    total, start = 0, len(messages)
    for i in range(len(messages) - 1, -1, -1):
        cost = estimate_tokens(messages[i])
        if total + cost > budget_tokens:
            break
        total += cost
        start = i
    while start < len(messages) and messages[start].role == "tool":
        start += 1
    return repair_tool_pairs(messages[start:])


def repair_tool_pairs(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Drop orphan tool results and add a synthetic result for calls that have none."""
    out: list[ChatMessage] = []
    pending: dict[str, ToolCall] = {}

    def close_pending() -> None:
        for call in pending.values():
            out.append(ChatMessage(role="tool", content=MISSING_RESULT, tool_call_id=call.id,
                                   name=call.name, is_error=True))
        pending.clear()

    for msg in messages:
        if msg.role == "tool":
            if msg.tool_call_id in pending:
                pending.pop(msg.tool_call_id)
                out.append(msg)
            continue
        close_pending()
        out.append(msg)
        if msg.role == "assistant":
            pending = {c.id: c for c in msg.tool_calls}
    close_pending()
    return out
