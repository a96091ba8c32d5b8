"""Journal marks along a message's path: accepted (durable before the platform ack),
turn started, side-effecting tool began, reply delivery began, done (issue 8; README
"Delivery guarantees").

Which tools have side effects is the tool registry's answer
(``ToolRegistry.side_effecting``: each tool's ``side_effects`` flag; MCP/plugin and
unknown tools count as side-effecting), so a turn that ran one is never re-run blindly
after a crash.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gateway.journal.store import IntakeJournal
from gateway.routing import Route
from gateway.turns.work import UserWork
from runtime.events import RuntimeEvent

log = structlog.get_logger(__name__)

_NOT_STORED = ("journal_id", "resume", "album_parts", "outcome", "tainted_by", "local_id",
               "album_messages")


def work_to_dict(work: UserWork) -> dict[str, Any]:
    """A UserWork as journal JSON (``route`` as a dict; journal bookkeeping left out)."""
    row = {k: v for k, v in dataclasses.asdict(work).items() if k not in _NOT_STORED}
    row["route"] = work.route.as_dict() if work.route else None
    return row


def work_from_dict(row: dict[str, Any], entry_id: str) -> UserWork:
    """The UserWork stored by :func:`work_to_dict` (unknown keys ignored, so journals
    written by a newer version still load)."""
    names = {f.name for f in dataclasses.fields(UserWork)}
    fields = {k: v for k, v in row.items() if k in names and k not in _NOT_STORED}
    fields["route"] = Route.from_dict(row.get("route"))
    return UserWork(**fields, journal_id=entry_id)


class JournalTracker:
    """Writes the journal marks for the gateway: ``accept`` from intake, ``turn_started`` /
    ``reply_sending`` from the turn executor, tool marks from the event bus
    (``on_runtime_event``) and ``done`` when the lane's future settles.
    ``side_effecting(tool)``: whether a tool's start is journaled."""

    def __init__(self, journal: IntakeJournal,
                 side_effecting: Callable[[str], bool]) -> None:
        self.journal = journal
        self.side_effecting = side_effecting
        self.outcomes: Any = None  # gateway/journal/recorder.py OutcomeRecorder

    async def accept(self, session_key: str, work: UserWork, dedupe: str | None,
                     mark_seen: Callable[[], Awaitable[bool]] | None = None) -> bool:
        """Append ``work`` and return once it is durable (True), or False when
        ``mark_seen()`` (the dedupe mark, run right after the line is written) says it is
        a duplicate. A crash between line and mark resumes the entry, and resume marks it
        seen, so a platform redelivery never runs it twice."""
        try:
            entry = self.journal.accept(session_key, work_to_dict(work), dedupe)
        except OSError as exc:  # disk full...: run it anyway, say it is not crash-safe
            log.error("journal_write_failed", session_key=session_key, error=str(exc),
                      path=str(self.journal.path))
            return mark_seen is None or await mark_seen()
        if mark_seen is not None and not await mark_seen():
            self.journal.done(entry.id)
            return False
        work.journal_id = entry.id
        try:
            await self.journal.durable()
        except OSError as exc:
            log.error("journal_write_failed", session_key=session_key, error=str(exc),
                      path=str(self.journal.path))
        return True

    async def hold(self, session_key: str, row: dict[str, Any],
                   dedupe: str | None) -> str | None:
        """Append a held album part (``row``: gateway/inbound/albums.py ``gated_row``) and
        return its entry id once durable; None when the journal cannot be written (the
        part is then held in memory only, and that is logged)."""
        try:
            entry = self.journal.accept(session_key, row, dedupe)
            await self.journal.durable()
        except OSError as exc:
            log.error("journal_write_failed", session_key=session_key, error=str(exc),
                      path=str(self.journal.path))
            return None
        return entry.id

    def turn_started(self, run_id: str, works: list[Any]) -> None:
        self.journal.started(_ids(works), run_id)

    def reply_sending(self, works: list[Any], text: str, key: str | None, *,
                      stream: bool = False) -> None:
        """Delivery of the reply begins (``stream``: a streamed reply, marked before its
        first piece is posted)."""
        self.journal.replying(_ids(works), text, key, stream=stream)

    def finished(self, works: list[Any]) -> None:
        """The reply was delivered or parked in the outbox: the entries are done."""
        for entry_id in _ids(works):
            self.journal.done(entry_id)

    def on_runtime_event(self, event: RuntimeEvent) -> None:
        """Event-bus subscriber: ``tool_run_start`` of a side-effecting tool is
        journaled before the tool runs (after its approval: a call that only waited for
        one, when the gateway stopped, did not run); ``turn_tainted`` (untrusted content
        reached the turn) is journaled so the turn re-run after a restart is tainted too
        (its context still holds that content)."""
        if event.type == "tool_run_start":
            tool = str(event.data.get("tool", ""))
            if self.side_effecting(tool):
                self.journal.tool_began(event.run_id, tool)
        elif event.type == "turn_tainted":
            self.journal.tainted(event.run_id, str(event.data.get("why", "")))

    def watch(self, work: UserWork, fut: asyncio.Future) -> None:
        """Mark ``work`` done when its lane future settles with a result or an error,
        unless the gateway records outcomes (``outcomes``: the recorder, which watches
        every message, marks it done with its outcome); a cancelled future (shutdown)
        leaves it for the next start."""
        entry_ids = _ids([work])
        if not entry_ids or self.outcomes is not None:
            return

        def settled(f: asyncio.Future) -> None:
            if not f.cancelled():
                for entry_id in entry_ids:
                    self.journal.done(entry_id)

        fut.add_done_callback(settled)


def _ids(works: list[Any]) -> list[str]:
    """Journal entries of ``works``, a merged album's other parts included."""
    return [i for w in works if getattr(w, "journal_id", None)
            for i in (w.journal_id, *getattr(w, "album_parts", ()))]
