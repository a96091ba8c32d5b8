"""Announcing a finished subagent run to its requester (seed 001 §6): what is said, and
the retry schedule when the announce fails.

Backoff 1 s, 2 s, 4 s, 8 s (the cap), at most :data:`MAX_RETRIES` retries after the first
attempt; the system event text is quoted data, never instructions from the gateway.
"""

from __future__ import annotations

import json

from runtime.subagents.records import RunRecord

MAX_RETRIES = 3
BACKOFF_CAP = 8.0
TEXT_LIMIT = 4000  # characters of the child's reply carried in the event

ANNOUNCE_PROMPT = (
    "A subagent you started has finished (see the Runtime System Events section). Tell the "
    "user what matters from its result, in your own words, or reply HEARTBEAT_OK if there "
    "is nothing to tell.")


def retry_delay(retry: int) -> float:
    """Seconds to wait before retry number ``retry`` (1-based): 1, 2, 4, 8, 8, ..."""
    return min(2.0 ** (retry - 1), BACKOFF_CAP)


def announce_text(rec: RunRecord) -> str:
    """The system event for the requester: run id, label, status and the (quoted,
    capped) result or error."""
    outcome = rec.outcome or {}
    name = f" ({rec.label})" if rec.label else ""
    text = str(outcome.get("text") or "")
    if len(text) > TEXT_LIMIT:
        text = text[:TEXT_LIMIT] + f"… [{len(text) - TEXT_LIMIT} more characters]"
    status = outcome.get("status", "unknown")
    parts = [f"Subagent run {rec.run_id}{name} finished with status {status}."]
    if outcome.get("error"):
        parts.append(f"Error: {json.dumps(str(outcome['error']), ensure_ascii=False)}")
    if text:
        parts.append(f"Result: {json.dumps(text, ensure_ascii=False)}")
    return " ".join(parts)
