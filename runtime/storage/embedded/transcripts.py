"""The embedded transcript store: one JSONL file per session,
``<state_dir>/agents/<agent>/sessions/<session_id>.jsonl`` (DESIGN.md "Files on disk"),
written by :class:`runtime.transcript.TranscriptWriter` exactly as before this interface
existed (same bytes, same one ``write(2)`` per durability point).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runtime.clock import Clock
from runtime.transcript import (
    TailResult,
    TranscriptWriter,
    iter_entries_reversed,
    read_tail,
)


def transcript_file(state_dir: Path, agent_id: str, session_id: str) -> Path:
    """``<state_dir>/agents/<agent>/sessions/<session_id>.jsonl``."""
    return state_dir / "agents" / agent_id / "sessions" / f"{session_id}.jsonl"


class FileTranscripts:
    """:class:`runtime.storage.transcripts.TranscriptStore` on JSONL files."""

    backend = "embedded"

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def path(self, agent_id: str, session_id: str) -> Path:
        return transcript_file(self.state_dir, agent_id, session_id)

    def location(self, agent_id: str, session_id: str) -> str:
        return str(self.path(agent_id, session_id))

    def writer(self, agent_id: str, session_id: str, session_key: str, *, clock: Clock,
               cwd: str | None = None) -> TranscriptWriter:
        return TranscriptWriter(self.path(agent_id, session_id), session_id=session_id,
                                session_key=session_key, clock=clock, cwd=cwd)

    def entries_reversed(self, agent_id: str, session_id: str
                         ) -> Iterator[tuple[dict[str, Any] | None, str | None]]:
        return iter_entries_reversed(self.path(agent_id, session_id))

    def tail(self, agent_id: str, session_id: str, max_bytes: int) -> TailResult:
        return read_tail(self.path(agent_id, session_id), max_bytes)

    def header(self, agent_id: str, session_id: str) -> dict[str, Any] | None:
        try:
            with self.path(agent_id, session_id).open(encoding="utf-8") as fh:
                header = json.loads(fh.readline())
        except (OSError, ValueError):
            return None
        return header if isinstance(header, dict) and header.get("type") == "session" \
            else None

    def export(self, agent_id: str, session_id: str) -> bytes | None:
        try:
            return self.path(agent_id, session_id).read_bytes()
        except FileNotFoundError:
            return None

    async def settled(self, session_id: str) -> None:
        """Files are written synchronously: nothing to wait for."""

    def close(self) -> None:
        pass
