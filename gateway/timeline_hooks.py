"""Wiring the per-session timeline into the gateway (issue 5 "Wiring"; seed 000).

Session creation initialises a timeline, ``/new``, ``/end`` and resets end it, and every
turn records USER_INPUT, LLM_RESPONSE, TOOL_CALL, TOOL_RESULT and drained SYSTEM_EVENTs;
the heartbeat and cron record HEARTBEAT and CRON_RUN. Recording never blocks a turn: events
go into an in-memory queue in call order and a background writer appends them (several
sessions concurrently, each session strictly in order), each stamped with the time it was
recorded. A held turn whose lines the transcript dropped (a HEARTBEAT_OK beat) is followed
by a marker so that ``rebuild-transcript`` drops it too. A failure is logged loudly and
surfaced in ``/status``; it is never swallowed.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import structlog

from runtime.timeline import Timeline, TimelineArchivedError, TimelineNotFoundError

log = structlog.get_logger(__name__)

_INIT = "__init__"


class TimelineHooks:
    """Session hooks + turn recorder backed by a :class:`Timeline`.

    ``problems`` is the gateway's list shown in ``/status``; ``key_of(session_id)`` finds
    the session key of a session that predates the timeline (its timeline is opened on its
    first recorded event).
    """

    def __init__(self, timeline: Timeline, problems: list[str],
                 key_of: Callable[[str], str | None] | None = None) -> None:
        self.timeline = timeline
        self.problems = problems
        self.key_of = key_of
        self.failures = 0
        self.appended = 0
        self.on_append: Callable[[float], None] | None = None  # seconds per append (metrics)
        self._queue: list[tuple[str, str, Any, float]] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._keys: dict[str, str] = {}
        self._task: asyncio.Task | None = None

    # -- producers (non-blocking) --------------------------------------------------------
    def record(self, session_id: str, event_type: str, content: dict[str, Any]) -> None:
        """Queue one event for ``session_id`` (the turn loop's recorder).

        The event is stamped now, when it happens, not when the writer gets to it."""
        self._queue.append((session_id, event_type, content, self.timeline.clock.time()))
        self._idle.clear()
        self._wake.set()

    async def session_created(self, entry: Any) -> None:
        self._keys[entry.session_id] = entry.session_key
        self.record(entry.session_id, _INIT, entry.session_key)

    async def session_ended(self, entry: Any, reason: str) -> None:
        self.record(entry.session_id, "SESSION_END", {"reason": reason})
        self._keys.pop(entry.session_id, None)

    def transcript_discarded(self, entry: Any, run_id: str, trigger: str, lines: int) -> None:
        """A held turn (HEARTBEAT_OK beat, ack-only system turn) left no transcript lines.

        Its events stay in the timeline; this marker (a SYSTEM_EVENT with ``transcript:
        "discarded"``) lets ``rebuild-transcript`` leave that turn out, as the transcript did.
        """
        self.record(entry.session_id, "SYSTEM_EVENT", {
            "text": f"{trigger} turn {run_id} was acknowledged only; its {lines} transcript "
                    "line(s) were not kept",
            "source": "gateway", "ts": int(self.timeline.clock.time() * 1000),
            "transcript": "discarded", "run_id": run_id, "trigger": trigger})

    # -- the writer ----------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def flush(self) -> None:
        """Wait until everything queued so far is written."""
        await self._idle.wait()

    async def close(self) -> None:
        """Write everything queued (up to 30 s), then close the timeline."""
        if self._task is not None:
            # Wait on the idle flag, not the queue: a batch already taken off the queue may
            # still be in flight, and cancelling it would drop the rest of that batch.
            try:
                await asyncio.wait_for(self.flush(), timeout=30)
            except TimeoutError:
                log.error("timeline_flush_timeout", pending=len(self._queue))
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.timeline.close()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._queue = self._queue, []
            by_session: dict[str, list[tuple[str, Any, float]]] = defaultdict(list)
            for sid, etype, content, at in batch:
                by_session[sid].append((etype, content, at))
            await asyncio.gather(*(self._write(sid, items)
                                   for sid, items in by_session.items()))
            if not self._queue:
                self._idle.set()

    async def _write(self, session_id: str, items: list[tuple[str, Any, float]]) -> None:
        tl = self.timeline
        for etype, content, at in items:
            t0 = time.perf_counter()
            try:
                if etype == _INIT:
                    await tl.init_timeline(session_id, content, at=at)
                else:
                    try:
                        await tl.append_event(session_id, etype, content, at=at)
                    except TimelineNotFoundError:
                        # A session from before the timeline existed: open one now.
                        key = self._keys.get(session_id) or (
                            self.key_of(session_id) if self.key_of else None) or "unknown"
                        await tl.init_timeline(session_id, key, at=at)
                        await tl.append_event(session_id, etype, content, at=at)
                self.appended += 1
                if self.on_append is not None:
                    self.on_append(time.perf_counter() - t0)
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
