"""A session's recent messages in display form (the control UI restores its chat and
shows transcripts from this): ``[{role: user|assistant|tool, text, ts (epoch ms), tools:
[{name, arguments}], is_error}]``, read from the tail of the session's transcript."""

from __future__ import annotations

from typing import Any

from channels.outbound.silent import silent_reply
from gateway.sessions import identity

TAIL_BYTES = 512 * 1024


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict)
                   and p.get("type") == "text")


def display_messages(entries: list[dict[str, Any]], limit: int = 200) -> list[dict[str, Any]]:
    """Display rows of transcript ``entries`` (oldest first), the newest ``limit``."""
    out = []
    for entry in entries:
        msg = entry.get("message") if entry.get("type") == "message" else None
        if not isinstance(msg, dict):
            continue
        role = {"toolResult": "tool"}.get(msg.get("role"), msg.get("role"))
        tools = [{"name": p.get("name"), "arguments": p.get("arguments")}
                 for p in msg.get("content") or [] if isinstance(p, dict)
                 and p.get("type") == "toolCall"]
        out.append({"id": entry.get("id"), "role": role, "text": _text(msg.get("content")),
                    "ts": msg.get("timestamp"), "tools": tools,
                    "tool": msg.get("toolName"), "is_error": bool(msg.get("isError"))})
    return out[-limit:]


def session_history(gw: Any, session_key: str) -> list[dict[str, Any]]:
    """Display messages of ``session_key`` ([] when it has no session yet), read from the
    gateway's transcript store (files or PostgreSQL; blocking)."""
    for agent in gw.agents.values():
        entry = identity.stored(agent.store, session_key)  # replicas: the shared store
        if entry is not None:
            tail = gw.logs.transcripts.tail(agent.id, entry.session_id, TAIL_BYTES)
            return display_messages(tail.entries)
    return []


def delivered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` as the chat showed them: a silent reply (``NO_REPLY``, README "Silent
    replies") left out, a mid-sentence token removed; the transcript keeps them raw."""
    out = []
    for row in rows:
        if row["role"] == "assistant" and row["text"]:
            verdict = silent_reply(row["text"])
            if verdict.silent and not row["tools"]:
                continue
            row = {**row, "text": verdict.text}
        out.append(row)
    return out


def webchat_history(gw: Any, client: str) -> tuple[str, list[dict[str, Any]]]:
    """The session key of webchat ``client`` and its messages as the page showed them."""
    _agent, key = gw.local.resolve(to=client, channel="webchat")
    return key, delivered(session_history(gw, key))
