"""Open session logs (transcript writer + in-memory context tail), kept in a bounded LRU.

Keeping the recent sessions' context in memory is what keeps a turn's cost independent of
the session's length; the LRU bound keeps memory independent of how many sessions exist.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from runtime.clock import Clock
from runtime.context import SessionLog


def transcript_path(state_dir: Path, agent_id: str, session_id: str) -> Path:
    """``<state_dir>/agents/<agent>/sessions/<session_id>.jsonl`` (DESIGN.md)."""
    return state_dir / "agents" / agent_id / "sessions" / f"{session_id}.jsonl"


class SessionLogs:
    def __init__(self, state_dir: Path, clock: Clock, *, capacity: int = 512) -> None:
        self.state_dir = state_dir
        self.clock = clock
        self.capacity = capacity
        self._open: OrderedDict[str, SessionLog] = OrderedDict()

    def get(self, agent_id: str, session_id: str, session_key: str, *,
            max_tokens: int = 200_000, cwd: str | None = None) -> SessionLog:
        log = self._open.get(session_id)
        if log is not None:
            self._open.move_to_end(session_id)
            return log
        log = SessionLog(transcript_path(self.state_dir, agent_id, session_id),
                         session_id=session_id, session_key=session_key, clock=self.clock,
                         max_tokens=max_tokens, cwd=cwd)
        self._open[session_id] = log
        while len(self._open) > self.capacity:
            _, old = self._open.popitem(last=False)
            old.close()
        return log

    def forget(self, session_id: str) -> None:
        log = self._open.pop(session_id, None)
        if log is not None:
            log.close()

    def close(self) -> None:
        for log in self._open.values():
            log.close()
        self._open.clear()
