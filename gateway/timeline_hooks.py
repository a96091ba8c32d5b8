"""Wiring the per-session timeline into the gateway (issue 5 "Wiring"; seed 000).

Session creation initialises a timeline, ``/new``, ``/end`` and resets end it, and every
turn records USER_INPUT, LLM_RESPONSE, TOOL_CALL, TOOL_RESULT and drained SYSTEM_EVENTs;
the heartbeat and cron record HEARTBEAT and CRON_RUN. Recording never blocks a turn: events
go into an in-memory queue in call order and a background writer appends them (several
sessions concurrently, each session strictly in order), each stamped with the time it was
recorded. During a turn the session's events are held (``hold``/``release``, driven by the
turn's durability points) and written as ONE transaction per turn — or per tool round, so
a tool call is on disk before its side effects (issue 9 "Disk"); ``settled`` lets the
gateway deliver a reply only once the turn's events are committed. A held turn whose lines the transcript dropped (a HEARTBEAT_OK beat) is followed
by a marker so that ``rebuild-transcript`` drops it too. A failure is logged loudly and
surfaced in ``/status``; it is never swallowed.

Replicas (issue 15): ``fence(session_key)`` gives the lane lease a write of that session
must still hold (gateway/cluster/fencing.py); a turn's events carry the one its turn
started under. PostgreSQL refuses them once another replica took the lane over
(``timeline_append_fenced``, and ``on_fenced(session_key)`` drops the lane here).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from runtime.timeline import (
    Timeline,
    TimelineArchivedError,
    TimelineFencedError,
    TimelineNotFoundError,
)

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
        self.on_append: Callable[[float], None] | None = None  # s per event (metrics)
        self.fence: Callable[[str], Any] | None = None  # session key -> lane fence
        self.on_fenced: Callable[[str], None] | None = None  # session key
        self.fenced = 0
        self._turn_fence: dict[str, Any] = {}  # held session -> the fence its turn took
        self._queue: list[tuple[str, str, Any, float, Any]] = []
        self._held: dict[str, list[tuple[str, str, Any, float, Any]]] = {}
        self._next: dict[str, asyncio.Future] = {}  # session -> its next write (queued)
        self._inflight: dict[str, asyncio.Future] = {}  # session -> its write in progress
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._keys: dict[str, str] = {}
        self._task: asyncio.Task | None = None

    # -- producers (non-blocking) --------------------------------------------------------
    def record(self, session_id: str, event_type: str, content: dict[str, Any]) -> None:
        """Queue one event for ``session_id`` (the turn loop's recorder).

        The event is stamped now, when it happens, not when the writer gets to it."""
        held = self._held.get(session_id)
        fence = self._turn_fence.get(session_id) if held is not None else \
            self._fence_now(session_id)
        item = (session_id, event_type, content, self.timeline.clock.time(), fence)
        if held is not None:
            held.append(item)
            return
        self._queue.append(item)
        self._idle.clear()
        self._wake.set()

    def _fence_now(self, session_id: str) -> Any:
        if self.fence is None:
            return None
        key = self._keys.get(session_id) or (self.key_of(session_id) if self.key_of
                                             else None)
        return self.fence(key) if key else None

    def hold(self, session_id: str) -> None:
        """Keep ``session_id``'s events in memory until :meth:`release` (a turn starts);
        they carry the lane fence of this moment."""
        if session_id not in self._held and self.fence is not None:
            self._turn_fence[session_id] = self._fence_now(session_id)
        self._held.setdefault(session_id, [])

    def release(self, session_id: str, *, end: bool = False) -> None:
        """Queue the held events as one write (a durability point of the turn); ``end``
        stops holding (the turn is over)."""
        held = self._held.pop(session_id, None) if end else self._held.get(session_id)
        if end:
            self._turn_fence.pop(session_id, None)
        if held:
            self._queue.extend(held)
            held.clear()
            self._idle.clear()
            self._wake.set()

    async def settled(self, session_id: str) -> None:
        """Wait until every event queued so far for ``session_id`` is committed (or has
        failed, which is reported as usual)."""
        if any(item[0] == session_id for item in self._queue):
            fut = self._next.get(session_id)
            if fut is None:
                fut = self._next[session_id] = asyncio.get_running_loop().create_future()
        else:
            fut = self._inflight.get(session_id)
        if fut is not None and not fut.done():
            await asyncio.shield(fut)

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
            by_session: dict[str, list[tuple[str, Any, float, Any]]] = defaultdict(list)
            for sid, etype, content, at, fence in batch:
                by_session[sid].append((etype, content, at, fence))
            loop = asyncio.get_running_loop()
            for sid in by_session:
                self._inflight[sid] = self._next.pop(sid, None) or loop.create_future()
            try:
                await asyncio.gather(*(self._write(sid, items)
                                       for sid, items in by_session.items()))
            finally:
                for sid in by_session:
                    fut = self._inflight.pop(sid)
                    if not fut.done():
                        fut.set_result(None)
            if not self._queue:
                self._idle.set()

    async def _write(self, session_id: str, items: list[tuple[str, Any, float, Any]]) -> None:
        """One transaction for everything the session queued since the last write (one
        per lane fence, in order, in the rare case they differ)."""
        start = 0
        for i in range(1, len(items) + 1):
            if i == len(items) or items[i][3] != items[start][3]:
                await self._write_run(session_id, [it[:3] for it in items[start:i]],
                                      items[start][3])
                start = i

    async def _write_run(self, session_id: str, items: list[tuple[str, Any, float]],
                         fence: Any) -> None:
        events = [("SESSION_CREATE" if etype == _INIT else etype, content, at)
                  for etype, content, at in items]
        t0 = time.perf_counter()
        try:
            results = await self.timeline.append_events(session_id, events, fence=fence)
            pairs = list(zip([ev[0] for ev in events], results))
            missing = [ev for ev, r in zip(events, results)
                       if isinstance(r, TimelineNotFoundError)]
            if missing:
                # A session from before the timeline existed: open one, then write again.
                key = self._keys.get(session_id) or (
                    self.key_of(session_id) if self.key_of else None) or "unknown"
                retry = [("SESSION_CREATE", key, missing[0][2]), *missing]
                pairs = [p for p in pairs if not isinstance(p[1], TimelineNotFoundError)]
                pairs += zip([ev[0] for ev in retry],
                             await self.timeline.append_events(session_id, retry,
                                                               fence=fence))
        except Exception as exc:  # noqa: BLE001 - reported loudly, never swallowed
            self._fail(session_id, items[0][0], exc)
            return
        ok = 0
        refused = [etype for etype, res in pairs if isinstance(res, TimelineFencedError)]
        if refused:
            self._refused(session_id, fence, refused)
        for etype, res in pairs:
            if isinstance(res, TimelineFencedError):
                continue
            if isinstance(res, TimelineArchivedError):
                self._fail(session_id, etype, res, level="warning")
            elif isinstance(res, BaseException):
                self._fail(session_id, etype, res)  # type: ignore[arg-type]
            else:
                self.appended += 1
                ok += 1
        if self.on_append is not None and ok:
            share = (time.perf_counter() - t0) / ok  # one transaction, split per event
            for _ in range(ok):
                self.on_append(share)

    def _refused(self, session_id: str, fence: Any, etypes: list[str]) -> None:
        """PostgreSQL refused the events: the lane moved to another replica, which
        writes this session's timeline now. Nothing was written; the lane is dropped."""
        self.fenced += len(etypes)
        log.warning("timeline_append_fenced", session_id=session_id, lease=fence[0],
                    replica=fence[1], generation=fence[2], event_types=etypes,
                    reason="another replica took this session's lane over")
        if self.on_fenced is not None:
            self.on_fenced(fence[0].removeprefix("lane:"))

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


async def open_timeline(gw: Any) -> TimelineHooks | None:
    """The gateway's timeline (``timeline.enabled``): SQLite at ``timeline.path`` (default
    ``<state_dir>/timeline.db``) or the PostgreSQL store, wrapped in its hooks. A timeline
    that cannot be opened is logged and listed in ``gw.problems``; the gateway then runs
    without one (returns None)."""
    cfg = gw.config.timeline
    if not cfg.enabled:
        return None
    path = Path(cfg.path).expanduser() if cfg.path else gw.state_dir / "timeline.db"
    gw.state_dir.mkdir(parents=True, exist_ok=True)
    try:
        timeline = (await Timeline.open_postgres(gw.pg, clock=gw.clock)
                    if gw.pg is not None else
                    await Timeline.open_sqlite(path, clock=gw.clock))
    except Exception as exc:  # noqa: BLE001 - run without it, but say so loudly
        log.error("timeline_open_failed", path=str(path), error=str(exc))
        gw.problems.append(f"timeline unavailable: {exc}")
        return None
    missing = getattr(timeline.store, "missing_triggers", None)
    if missing:  # recreated, but someone removed them: say so in /status too
        gw.problems.append(f"timeline: immutability triggers were missing and were "
                           f"recreated: {', '.join(missing)}")
    return TimelineHooks(timeline, gw.problems, key_of=lambda sid: next(
        (e.session_key for a in gw.agents.values()
         if (e := a.store.by_session_id(sid)) is not None), None))
