"""Wiring the per-session timeline into the gateway (issue 5 "Wiring"; seed 000).

Session creation initialises a timeline, ``/new``, ``/end`` and resets end it, and every
turn records USER_INPUT, LLM_RESPONSE, TOOL_CALL, TOOL_RESULT and drained SYSTEM_EVENTs;
the heartbeat and cron record HEARTBEAT and CRON_RUN. Recording never blocks a turn: events
go into an in-memory queue in call order and a background writer appends them (several
sessions concurrently, each session strictly in order). A failure is logged loudly and
surfaced in ``/status``; it is never swallowed.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import structlog

from runtime.timeline import Timeline, TimelineArchivedError, TimelineNotFoundError

log = structlog.get_logger(__name__)

_INIT = "__init__"


class TimelineHooks:
    """Session hooks + turn recorder backed by a :class:`Timeline`."""

    def __init__(self, timeline: Timeline, problems: list[str]) -> None:
        self.timeline = timeline
        self.problems = problems
        self.failures = 0
        self.appended = 0
        self._queue: list[tuple[str, str, Any]] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._keys: dict[str, str] = {}
        self._task: asyncio.Task | None = None

    # -- producers (non-blocking) --------------------------------------------------------
    def record(self, session_id: str, event_type: str, content: dict[str, Any]) -> None:
        """Queue one event for ``session_id`` (the turn loop's recorder)."""
        self._queue.append((session_id, event_type, content))
        self._idle.clear()
        self._wake.set()

    async def session_created(self, entry: Any) -> None:
        self._keys[entry.session_id] = entry.session_key
        self.record(entry.session_id, _INIT, entry.session_key)

    async def session_ended(self, entry: Any, reason: str) -> None:
        self.record(entry.session_id, "SESSION_END", {"reason": reason})

    # -- the writer ----------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def flush(self) -> None:
        """Wait until everything queued so far is written."""
        await self._idle.wait()

    async def close(self) -> None:
        if self._task is not None:
            if self._queue:
                await asyncio.wait_for(self.flush(), timeout=30)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.timeline.close()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._queue = self._queue, []
            by_session: dict[str, list[tuple[str, Any]]] = defaultdict(list)
            for sid, etype, content in batch:
                by_session[sid].append((etype, content))
            await asyncio.gather(*(self._write(sid, items)
                                   for sid, items in by_session.items()))
            if not self._queue:
                self._idle.set()

    async def _write(self, session_id: str, items: list[tuple[str, Any]]) -> None:
        for etype, content in items:
            try:
                if etype == _INIT:
                    await self.timeline.init_timeline(session_id, content)
                else:
                    try:
                        await self.timeline.append_event(session_id, etype, content)
                    except TimelineNotFoundError:
                        # A session from before the timeline existed: open one now.
                        key = self._keys.get(session_id) or "unknown"
                        await self.timeline.init_timeline(session_id, key)
                        await self.timeline.append_event(session_id, etype, content)
                self.appended += 1
            except TimelineArchivedError as exc:
                self._fail(session_id, etype, exc, level="warning")
            except Exception as exc:  # noqa: BLE001 - reported loudly, never swallowed
                self._fail(session_id, etype, exc)

    def _fail(self, session_id: str, etype: str, exc: Exception, level: str = "error") -> None:
        self.failures += 1
        getattr(log, level)("timeline_append_failed", session_id=session_id,
                            event_type=etype, error=str(exc), error_type=type(exc).__name__)
        msg = f"timeline: {type(exc).__name__}: {exc}"
        if msg not in self.problems:
            self.problems.append(msg)
            del self.problems[:-20]

    def status(self) -> dict[str, Any]:
        return {"appended": self.appended, "failures": self.failures,
                "pending": len(self._queue)}
