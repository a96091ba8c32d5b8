"""A turn's durability points (issue 9 "Disk"): the transcript lines and timeline events a
turn produces are held in memory and written together — one ``write(2)`` to the transcript
and one SQLite transaction to the timeline — at each point where losing them would matter:
the user's input reaches the transcript (committed, on PostgreSQL too: ``input_stored``)
before the model is called, a round's tool calls
are on disk before the tools run (a side effect is never left unrecorded), and the rest
when the turn ends (normally, by error, timeout or cancellation). A turn without tools
commits one timeline transaction and makes two transcript writes (input, answer).

A process killed mid-turn loses that turn's unwritten answer lines and timeline events
(the transcript keeps the user's message, as a cut-off turn always did).
"""

from __future__ import annotations

from typing import Any


class TurnBatch:
    """Context manager over one turn. ``sink`` may be a SessionLog (anything else is left
    alone); ``recorder`` may offer ``hold(session_id)`` / ``release(session_id, end=)``
    (the gateway's timeline hooks)."""

    def __init__(self, sink: Any, recorder: Any, session_id: str) -> None:
        self._sink = sink if hasattr(sink, "begin_batch") else None
        self._rec = recorder if hasattr(recorder, "hold") else None
        self.session_id = session_id

    def __enter__(self) -> TurnBatch:
        if self._sink is not None:
            self._sink.begin_batch()
        if self._rec is not None:
            self._rec.hold(self.session_id)
        return self

    def flush_input(self) -> None:
        """The turn's input (user messages) goes to the transcript at once: a message the
        user sent is never lost to a crash, whatever the intake did. Timeline events stay
        held (one transaction per turn)."""
        if self._sink is not None:
            self._sink.flush_batch()

    async def input_stored(self) -> None:
        """After :meth:`flush_input`, before the model call: wait until the input lines are
        stored. A file has them at the flush; PostgreSQL commits them in the background
        (one multi-row INSERT for every session that flushed meanwhile), so without the
        wait a crash during the model call could lose a message the platform was already
        told was received."""
        if self._sink is not None and hasattr(self._sink, "settled"):
            await self._sink.settled()

    def flush(self) -> None:
        """A durability point: write what is held (the turn goes on batching)."""
        self._write(end=False)

    def _write(self, *, end: bool) -> None:
        try:
            if self._sink is not None:
                self._sink.flush_batch(end=end)
        finally:
            if self._rec is not None:
                self._rec.release(self.session_id, end=end)

    def __exit__(self, *exc: object) -> None:
        self._write(end=True)
