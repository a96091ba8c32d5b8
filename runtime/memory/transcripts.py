"""Transcripts as a memory source (``memory.index_transcripts: true``): every user and
assistant message of the agent's transcripts becomes one search paragraph in the scope of
the person the conversation belongs to.

``scope_of(session_key)`` decides that scope (the gateway's ``MemoryHub``): a one-person
conversation (a DM session whose key names the channel and the peer) maps to
``user:<canonical sender id>``; any other session (groups, threads, a DM session shared
by everyone, cron, subagents, the local surfaces) gives None and is not indexed, because
a transcript line does not carry a verified sender id: a group turn must never surface in
another member's scope.

Transcripts are append-only, so each file is read from where the last read stopped (after
its last complete line): only new lines are parsed, and, content-hashed as every
paragraph, only their paragraphs are embedded. ``bytes_read`` counts what was read (tests).
Paragraph shape: ``path`` ``transcripts/<session_id>.jsonl``, ``line`` the line number,
``heading`` ``"user"``/``"assistant"``, ``created_at`` the message time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.memory.paragraphs import Paragraph

MAX_CHARS = 4_000  # of one message's text (a paragraph, embedded as one input)


@dataclass(slots=True)
class TranscriptState:
    offset: int = 0  # bytes consumed (up to the last complete line)
    lines: int = 0
    scope: str | None = None
    header_seen: bool = False
    paragraphs: list[Paragraph] = field(default_factory=list)


def message_text(message: dict[str, Any]) -> str:
    """The text parts of a transcript message (no tool calls, no media)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(p.get("text", "") for p in content
                     if isinstance(p, dict) and p.get("type") == "text").strip()


class TranscriptSource:
    """The paragraphs of every ``*.jsonl`` in ``sessions_dir`` whose session ``scope_of``
    maps to a scope. Not thread-safe on its own (``MemoryIndex`` holds its lock)."""

    def __init__(self, sessions_dir: str | Path,
                 scope_of: Callable[[str], str | None]) -> None:
        self.dir = Path(sessions_dir)
        self.scope_of = scope_of
        self.bytes_read = 0
        self._files: dict[str, TranscriptState] = {}

    def refresh(self) -> tuple[bool, list[Paragraph]]:
        """(changed since the last call, every paragraph). Blocking."""
        changed = False
        present = sorted(self.dir.glob("*.jsonl")) if self.dir.is_dir() else []
        names = {p.name for p in present}
        if set(self._files) - names:
            changed = True
            self._files = {k: v for k, v in self._files.items() if k in names}
        for path in present:
            state = self._files.setdefault(path.name, TranscriptState())
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if size < state.offset:  # replaced (not appended to): read it again
                state = self._files[path.name] = TranscriptState()
            if size > state.offset and self._read(path, state):
                changed = True
        return changed, [p for f in self._files.values() for p in f.paragraphs]

    def _read(self, path: Path, state: TranscriptState) -> bool:
        with open(path, "rb") as fh:
            fh.seek(state.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        if end == 0:
            return False
        self.bytes_read += end
        state.offset += end
        return consume(state, data[:end].splitlines(), path.name, self.scope_of)


def consume(state: TranscriptState, lines: list[Any], name: str,
            scope_of: Callable[[str], str | None]) -> bool:
    """Parse the next ``lines`` (JSON text or bytes, in order) of transcript ``name`` into
    ``state``; True when a paragraph was added. Shared with the PostgreSQL source
    (runtime/storage/postgres/memory_transcripts.py)."""
    added = False
    for raw in lines:
        state.lines += 1
        try:
            entry = json.loads(raw)
        except ValueError:
            continue  # a torn or invalid line (the transcript reader reports it)
        if not isinstance(entry, dict):
            continue
        if not state.header_seen:
            state.header_seen = True
            if entry.get("type") == "session":
                state.scope = scope_of(str(entry.get("session_key") or ""))
                continue
        if state.scope is not None and (para := _paragraph(entry, name, state)):
            state.paragraphs.append(para)
            added = True
    return added


def _paragraph(entry: dict[str, Any], name: str, state: TranscriptState) -> Paragraph | None:
    msg = entry.get("message")
    if entry.get("type") != "message" or not isinstance(msg, dict):
        return None
    role = msg.get("role")
    text = message_text(msg)[:MAX_CHARS]
    if role not in ("user", "assistant") or not text:
        return None
    ts = msg.get("timestamp")
    created = float(ts) / 1000 if isinstance(ts, (int, float)) else 0.0
    return Paragraph(text, str(role), f"transcripts/{name}", state.lines, created,
                     state.scope or "")
