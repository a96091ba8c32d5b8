"""The transcript store interface (issue 15 "Transcripts on PostgreSQL"): where a session's
OpenClaw-v3 transcript lines live (format: :mod:`runtime.transcript`).

Two backends with the same line bytes:

- ``embedded`` (:class:`runtime.storage.embedded.transcripts.FileTranscripts`): one JSONL
  file per session, ``<state_dir>/agents/<agent>/sessions/<session_id>.jsonl``, written as
  before (one ``write(2)`` per durability point on an ``O_APPEND`` descriptor).
- ``postgres`` (:class:`runtime.storage.postgres.transcripts.PgTranscripts`): the table
  ``transcript_lines`` partitioned per agent, one row per line (``seq`` 0 is the header),
  append-only (triggers refuse UPDATE/DELETE/TRUNCATE).

``export`` returns the JSONL bytes a single host keeps, so ``tidegate sessions export KEY``
is byte-identical on both backends for the same turns. All methods are blocking (the
PostgreSQL backend goes through its :class:`SyncBridge`); the writer's ``flush`` does not
block on PostgreSQL (the lines are committed in order in the background) and
``settled(session_id)`` awaits them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from runtime.clock import Clock
from runtime.transcript import TailResult


class TranscriptSink(Protocol):
    """One session's writer (:class:`runtime.transcript.TranscriptWriter` on files)."""

    session_id: str
    session_key: str
    last_id: str | None

    def open(self) -> Any: ...
    def append(self, entry_type: str, body: dict[str, Any], *,
               timestamp: float | None = None) -> dict[str, Any]: ...
    def append_message(self, message: dict[str, Any]) -> dict[str, Any]: ...
    def hold(self) -> None: ...
    def flush(self, *, end: bool = False) -> None: ...
    def close(self) -> None: ...


class TranscriptStore(Protocol):
    """Every agent's transcripts on one backend."""

    backend: str  # "embedded" | "postgres"

    def location(self, agent_id: str, session_id: str) -> str:
        """Where the transcript lives, for people (a file path, or ``postgresql:...``)."""

    def writer(self, agent_id: str, session_id: str, session_key: str, *, clock: Clock,
               cwd: str | None = None) -> TranscriptSink:
        """A writer appending to the session's transcript (opened on first use)."""

    def entries_reversed(self, agent_id: str, session_id: str
                         ) -> Iterator[tuple[dict[str, Any] | None, str | None]]:
        """``(entry, None)`` newest first, ``(None, reason)`` for an unreadable line; the
        header is skipped. Stops cheaply when the caller stops iterating."""

    def tail(self, agent_id: str, session_id: str, max_bytes: int) -> TailResult:
        """About the last ``max_bytes`` of the transcript, parsed, oldest first."""

    def header(self, agent_id: str, session_id: str) -> dict[str, Any] | None:
        """The session header line, or None when there is no transcript."""

    def export(self, agent_id: str, session_id: str) -> bytes | None:
        """The whole transcript as the JSONL bytes a single host keeps (None: none)."""

    async def settled(self, session_id: str) -> None:
        """Wait until every line flushed so far for ``session_id`` is committed."""

    def close(self) -> None:
        """Release what the store holds (not the shared bridge)."""
