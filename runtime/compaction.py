"""Auto-compaction: when a session's context nears the model budget, older messages are
summarised by the model and replaced by that summary (seed 003 §3.2; DESIGN.md "Files on
disk": the transcript gets a ``compaction`` entry and is never rewritten).

Triggered at the start of a turn when the cached context exceeds ``threshold`` of the
budget; keeps the newest ``keep_ratio`` of the budget verbatim (never separating a tool call
from its result) and summarises the rest. If the summary call fails, the turn goes on with
plain truncation (the oldest messages drop out of the window).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.context.budget import estimate_tokens
from runtime.providers.base import ChatMessage, ModelRequest

SUMMARY_SYSTEM = (
    "You compress conversations for an AI agent's memory. Write a faithful summary of the "
    "conversation below: the user's goals and preferences, decisions made, facts learned, "
    "files and commands involved, open tasks and promises. Keep names, numbers, paths and "
    "dates exact. Write plain prose and bullet points, no preamble.")
MAX_SOURCE_CHARS = 200_000
SUMMARY_SHARE = 0.2  # the summary is capped to this share of the budget


@dataclass(slots=True)
class CompactionPlan:
    keep_from: int          # index of the first message kept verbatim
    tokens_before: int      # estimated context tokens before compaction


def plan_compaction(messages: list[ChatMessage], budget: int, *, threshold: float,
                    keep_ratio: float) -> CompactionPlan | None:
    """None when the context is below ``threshold`` x ``budget``; else where to cut."""
    total = sum(estimate_tokens(m) for m in messages)
    if threshold <= 0 or total <= budget * threshold or len(messages) < 3:
        return None
    keep_budget, kept, cut = budget * keep_ratio, 0, len(messages)
    for i in range(len(messages) - 1, 0, -1):
        cost = estimate_tokens(messages[i])
        if kept + cost > keep_budget:
            break
        kept += cost
        cut = i
    while cut < len(messages) and messages[cut].role == "tool":
        cut += 1  # a tool result stays with its call
    if cut >= len(messages):
        cut = len(messages) - 1
        while cut > 1 and messages[cut].role == "tool":
            cut -= 1
    if cut <= 0:
        return None
    return CompactionPlan(keep_from=cut, tokens_before=total)


def render_for_summary(messages: list[ChatMessage]) -> str:
    """A transcript of ``messages`` as plain text for the summariser (capped)."""
    lines = []
    for m in messages:
        if m.role == "tool":
            lines.append(f"[tool result {m.name}]: {m.content[:1000]}")
            continue
        text = m.content
        if m.tool_calls:
            calls = ", ".join(f"{c.name}({str(c.arguments)[:200]})" for c in m.tool_calls)
            text = f"{text}\n[called tools: {calls}]".strip()
        lines.append(f"{m.role}: {text}")
    source = "\n\n".join(lines)
    return source[-MAX_SOURCE_CHARS:]


def summary_request(messages: list[ChatMessage], max_tokens: int = 1500) -> ModelRequest:
    return ModelRequest(model="", system=SUMMARY_SYSTEM, stream=False, max_tokens=max_tokens,
                        messages=[ChatMessage(role="user", content=render_for_summary(
                            messages))])
