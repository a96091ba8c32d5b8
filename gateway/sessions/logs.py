"""Open session logs (transcript writer + in-memory context tail), kept in a bounded LRU.

Keeping the recent sessions' context in memory is what keeps a turn's cost independent of
the session's length; the LRU bound keeps memory independent of how many sessions exist.
The transcripts themselves live in the configured transcript store
(runtime/storage/transcripts.py: JSONL files, or PostgreSQL).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

from runtime.clock import Clock
from runtime.context.session_log import SessionLog
from runtime.storage.embedded.transcripts import FileTranscripts, transcript_file


def transcript_path(state_dir: Path, agent_id: str, session_id: str) -> Path:
    """``<state_dir>/agents/<agent>/sessions/<session_id>.jsonl`` (DESIGN.md)."""
    return transcript_file(state_dir, agent_id, session_id)


class SessionLogs:
    """``transcripts``: the transcript store (default: JSONL files under ``state_dir``)."""

    def __init__(self, state_dir: Path, clock: Clock, *, capacity: int = 512,
                 transcripts: Any = None) -> None:
        self.state_dir = state_dir
        self.clock = clock
        self.capacity = capacity
        self.transcripts = transcripts or FileTranscripts(state_dir)
        self._open: OrderedDict[str, SessionLog] = OrderedDict()

    def get(self, agent_id: str, session_id: str, session_key: str, *,
            max_tokens: int = 200_000, cwd: str | None = None) -> SessionLog:
        log = self._open.get(session_id)
        if log is not None and not getattr(log.writer, "stale", False):
            self._open.move_to_end(session_id)
            return log
        self._open.pop(session_id, None)
        log = self._new(agent_id, session_id, session_key, max_tokens, cwd)
        self._open[session_id] = log
        while len(self._open) > self.capacity:
            _, old = self._open.popitem(last=False)
            old.close()
        return log

    def _new(self, agent_id: str, session_id: str, session_key: str, max_tokens: int,
             cwd: str | None) -> SessionLog:
        store = self.transcripts
        if isinstance(store, FileTranscripts):  # the hot path as it always was
            return SessionLog(store.path(agent_id, session_id), session_id=session_id,
                              session_key=session_key, clock=self.clock,
                              max_tokens=max_tokens, cwd=cwd)
        return SessionLog(store.location(agent_id, session_id), session_id=session_id,
                          session_key=session_key, clock=self.clock, max_tokens=max_tokens,
                          cwd=cwd, writer=store.writer(agent_id, session_id, session_key,
                                                       clock=self.clock, cwd=cwd),
                          entries=lambda: store.entries_reversed(agent_id, session_id))

    async def settled(self, session_id: str) -> None:
        """Wait until the session's flushed transcript lines are committed."""
        await self.transcripts.settled(session_id)

    def forget(self, session_id: str) -> None:
        log = self._open.pop(session_id, None)
        if log is not None:
            log.close()

    def forget_key(self, session_key: str) -> None:
        """Drop the cached log of ``session_key`` (its lane moved to another replica: the
        next turn here reloads the transcript)."""
        for sid, log in list(self._open.items()):
            if log.writer.session_key == session_key:
                self.forget(sid)

    def close(self) -> None:
        for log in self._open.values():
            log.close()
        self._open.clear()

    async def aclose(self) -> None:
        """Close every log and wait until the store has committed what they flushed."""
        self.close()
        flush = getattr(self.transcripts, "flush", None)
        if flush is not None:
            await flush()
