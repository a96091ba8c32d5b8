"""Transcripts as a memory source on PostgreSQL storage: the ``TranscriptSource`` of
``runtime/memory/transcripts.py`` over ``transcript_lines`` instead of the files.

Same paragraphs and the same scope rule (``scope_of(session_key)`` from the header line,
seq 0). Each refresh asks for the newest seq of every session of the agent (one indexed
query) and reads only the lines after the last one it has; ``lines_read`` counts them
(tests). Blocking (through the SyncBridge); ``MemoryIndex`` calls it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.memory.paragraphs import Paragraph
from runtime.memory.transcripts import TranscriptState, consume


class PgTranscriptSource:
    """The agent ``agent_id``'s transcripts in PostgreSQL as memory paragraphs."""

    def __init__(self, bridge: Any, agent_id: str,
                 scope_of: Callable[[str], str | None]) -> None:
        self.bridge, self.agent_id, self.scope_of = bridge, agent_id, scope_of
        self.lines_read = 0
        self._sessions: dict[str, tuple[int, TranscriptState]] = {}  # sid -> (next seq, state)

    def refresh(self) -> tuple[bool, list[Paragraph]]:
        """(changed since the last call, every paragraph). Blocking."""
        heads = dict(self.bridge.call(lambda c: c.fetch(
            "SELECT session_id, max(seq) FROM transcript_lines WHERE agent_id = $1 "
            "GROUP BY session_id", self.agent_id)))
        changed = bool(set(self._sessions) - set(heads))
        for sid in set(self._sessions) - set(heads):
            del self._sessions[sid]
        for sid, last in heads.items():
            nxt, state = self._sessions.get(sid, (0, TranscriptState()))
            if last < nxt:
                continue
            rows = self.bridge.call(lambda c, sid=sid, nxt=nxt: c.fetch(
                "SELECT seq, line FROM transcript_lines WHERE agent_id = $1 AND "
                "session_id = $2 AND seq >= $3 ORDER BY seq", self.agent_id, sid, nxt))
            self.lines_read += len(rows)
            if consume(state, [r["line"] for r in rows], f"{sid}.jsonl", self.scope_of):
                changed = True
            self._sessions[sid] = (rows[-1]["seq"] + 1 if rows else nxt, state)
        return changed, [p for _, st in self._sessions.values() for p in st.paragraphs]
