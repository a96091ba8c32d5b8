"""A session's recent messages in display form (the control UI restores its chat and
shows transcripts from this): ``[{role: user|assistant|tool, text, ts (epoch ms), tools:
[{name, arguments}], is_error}]``, read from the tail of the JSONL transcript."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.transcript import read_tail

TAIL_BYTES = 512 * 1024


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict)
                   and p.get("type") == "text")


def display_messages(path: Path, limit: int = 200) -> list[dict[str, Any]]:
    out = []
    for entry in read_tail(path, TAIL_BYTES).entries:
        msg = entry.get("message") if entry.get("type") == "message" else None
        if not isinstance(msg, dict):
            continue
        role = {"toolResult": "tool"}.get(msg.get("role"), msg.get("role"))
        tools = [{"name": p.get("name"), "arguments": p.get("arguments")}
                 for p in msg.get("content") or [] if isinstance(p, dict)
                 and p.get("type") == "toolCall"]
        out.append({"role": role, "text": _text(msg.get("content")),
                    "ts": msg.get("timestamp"), "tools": tools,
                    "tool": msg.get("toolName"), "is_error": bool(msg.get("isError"))})
    return out[-limit:]


def session_history(gw: Any, session_key: str) -> list[dict[str, Any]]:
    """Display messages of ``session_key`` ([] when it has no session yet)."""
    for agent in gw.agents.values():
        entry = agent.store.get(session_key)
        if entry is not None:
            return display_messages(gw.state_dir / "agents" / agent.id / "sessions" /
                                    f"{entry.session_id}.jsonl")
    return []


def webchat_history(gw: Any, client: str) -> tuple[str, list[dict[str, Any]]]:
    _agent, key = gw.local.resolve(to=client, channel="webchat")
    return key, session_history(gw, key)
