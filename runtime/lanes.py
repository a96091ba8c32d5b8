"""Lanes: per-session serial execution of turns under global caps per lane kind
(seed 001 §lanes; DESIGN.md step 5).

Each session key has a lane that runs its turns strictly one at a time, in arrival order.
A semaphore per lane kind (``main``, ``cron``, ``subagent``) bounds concurrency across
sessions. Work that arrives while a session is busy follows the queue mode:

A message to an IDLE session starts its turn at once, whatever the mode, unless its
channel asks for an idle debounce (``submit(..., idle_debounce=s)``, from
``channels.<p>.debounce``): then messages of the same burst that arrive within ``s`` seconds
of each other share its turn.

Only messages with the same merge key merge, steer or interrupt (``merge_key``: the
gateway's is the surface/account/chat/thread a reply goes to plus the sender, and a fresh
key per request for the request/response surfaces, whose caller awaits its own answer): a
queued message with another key keeps its own turn, after the ones before it (arrival
order stays).

- ``followup``: its own turn, next in line.
- ``collect``: merged with other user messages that arrive while the lane is busy, into one
  turn, which starts ``debounce`` seconds after the last of them (and not before the
  running turn ends).
- ``steer``: handed to the running turn (``TurnControl.take_steer``) before its next model
  call; anything the turn did not take runs next.
- ``interrupt``: the running turn is cancelled; queued user messages and the new one run
  next, together.

Every submitted item's future resolves exactly once, with the result of the turn that
consumed it (or that turn's exception). Idle lanes are dropped, so memory does not grow
with the number of sessions ever seen.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog

from runtime import telemetry
from runtime.clock import SYSTEM_CLOCK, Clock

log = structlog.get_logger(__name__)

QUEUE_MODES = ("followup", "collect", "steer", "interrupt")
# Sized for I/O-bound turns (a turn mostly waits for its model); they protect the host,
# provider load is limited per provider (models.providers.<p>.max_concurrent).
DEFAULT_CAPS = {"main": 32, "cron": 4, "subagent": 16}


class LaneClosed(RuntimeError):
    """Raised by ``submit`` after ``close()`` (the gateway is shutting down)."""


@dataclass(slots=True)
class TurnInterrupted:
    """Result given to the items of a turn cancelled by an ``interrupt`` message."""

    reason: str = "interrupted by a newer message"


@dataclass(slots=True)
class _Item:
    payload: Any
    future: asyncio.Future
    queued_ns: int = 0  # when it was submitted (epoch ns): the turn trace's start
    route: Hashable = None  # its merge key: only items with equal keys share a turn


@dataclass(slots=True)
class _Batch:
    items: list[_Item]
    mergeable: bool
    ready_at: float = 0.0
    idle: bool = False  # queued while the session was idle (not yet started)
    burst: float = 0.0  # idle-session burst window (seconds), from the channel's debounce

    def takes(self, item: _Item) -> bool:
        """True when ``item`` may join this batch (a user batch of the same reply route)."""
        return self.mergeable and self.items[0].route == item.route


class TurnControl:
    """What a running turn can ask its lane: steering messages and whether it was aborted."""

    def __init__(self, steerable: bool, cap: asyncio.Semaphore | None = None,
                 route: Hashable = None) -> None:
        self.steerable = steerable
        self.route = route  # the running batch's merge key: only its route steers in
        self.aborted = False
        self.abort_reason: str | None = None  # "stop" (/stop, abort API) or None
        self._steer: list[_Item] = []
        self._taken: list[_Item] = []
        self._cap = cap  # the lane kind's global cap slot, while this turn holds it

    @asynccontextmanager
    async def cap_released(self) -> AsyncIterator[None]:
        """Give the lane-kind cap slot back while waiting (for a provider slot), so a
        saturated provider does not hold up turns that need something else; the slot is
        taken again before the block's caller goes on."""
        cap, self._cap = self._cap, None
        if cap is None:
            yield
            return
        cap.release()
        yield  # an exception leaves without the slot: _run_batch releases only a held one
        await cap.acquire()
        self._cap = cap

    def take_steer(self) -> list[Any]:
        """Payloads steered into this turn since the last call (the turn now owns them)."""
        items, self._steer = self._steer, []
        self._taken += items
        return [i.payload for i in items]


Runner = Callable[[str, list[Any], TurnControl], Awaitable[Any]]
MergeKey = Callable[[Any], Hashable]


@dataclass
class _Lane:
    key: str
    kind: str
    queue: deque = field(default_factory=deque)
    control: TurnControl | None = None
    task: asyncio.Task | None = None
    pump: asyncio.Task | None = None


class LaneManager:
    """Owns every lane. ``runner(key, payloads, control)`` executes one turn;
    ``merge_key(payload)`` is a payload's reply route (hashable): user messages merge into
    one turn only when their keys are equal (None: every payload has the same key)."""

    def __init__(self, runner: Runner, *, caps: dict[str, int] | None = None,
                 clock: Clock = SYSTEM_CLOCK, mode: str = "collect", debounce: float = 1.0,
                 max_queue: int = 50, merge_key: MergeKey | None = None) -> None:
        if mode not in QUEUE_MODES:
            raise ValueError(f"unknown queue mode {mode!r}")
        self.runner = runner
        self.merge_key = merge_key
        self.clock = clock
        self.mode = mode
        self.debounce = debounce
        self.max_queue = max_queue
        self.caps = {**DEFAULT_CAPS, **(caps or {})}
        self._sems = {k: asyncio.Semaphore(v) for k, v in self.caps.items()}
        self._lanes: dict[str, _Lane] = {}
        self._running: dict[str, int] = {k: 0 for k in self.caps}
        self._closed = False
        self.abandoned: list[tuple[str, Any]] = []  # (key, payload) never run: see drain

    # -- queries -------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True after ``close()``: no more work is accepted."""
        return self._closed

    def is_busy(self, key: str) -> bool:
        """True while the session has a running or queued turn."""
        lane = self._lanes.get(key)
        return lane is not None and (lane.control is not None or bool(lane.queue))

    def is_running(self, key: str) -> bool:
        lane = self._lanes.get(key)
        return lane is not None and lane.control is not None

    def lane_count(self) -> int:
        return len(self._lanes)

    def stats(self) -> dict[str, Any]:
        queued = sum(sum(len(b.items) for b in lane.queue) for lane in self._lanes.values())
        return {"lanes": len(self._lanes), "running": dict(self._running), "queued": queued,
                "caps": dict(self.caps)}

    # -- intake --------------------------------------------------------------------------
    def submit(self, key: str, payload: Any, *, kind: str = "main", mergeable: bool = True,
               mode: str | None = None, idle_debounce: float = 0.0) -> asyncio.Future:
        """Queue ``payload`` on the lane of ``key``; returns a future of the turn's result.

        ``mergeable`` is True for user messages (they follow the queue mode); heartbeat,
        cron and system turns pass False and always get their own turn. A mergeable
        payload for an idle lane starts at once, or after ``idle_debounce`` seconds of
        burst merging when that is > 0. Raises LaneClosed after ``close()``.
        """
        if self._closed:
            raise LaneClosed("the gateway is shutting down")
        mode = mode or self.mode
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        item = _Item(payload, fut, time.time_ns(),
                     self.merge_key(payload) if self.merge_key is not None else None)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(key=key, kind=kind if kind in self._sems else "main")
        now = self.clock.monotonic()
        control = lane.control
        same = control is not None and control.steerable and control.route == item.route
        if mergeable and same and mode == "steer":
            control._steer.append(item)
        elif mergeable and same and mode == "interrupt":
            self._interrupt(lane, item)
        else:
            self._enqueue(lane, item, mergeable, mode, now, idle_debounce)
        if lane.pump is None or lane.pump.done():
            lane.pump = asyncio.get_running_loop().create_task(self._pump(lane))
        return fut

    def _enqueue(self, lane: _Lane, item: _Item, mergeable: bool, mode: str, now: float,
                 idle_debounce: float = 0.0) -> None:
        last = lane.queue[-1] if lane.queue else None
        if mergeable and last is not None and last.idle and last.takes(item) and (
                last.burst > 0 or mode != "followup"):
            last.items.append(item)  # same idle burst, not started yet
            last.ready_at = max(last.ready_at, now + last.burst)
            return
        can_merge = mergeable and last is not None and last.takes(item) and (
            mode != "followup" or len(lane.queue) >= self.max_queue)
        if can_merge:
            last.items.append(item)
            if mode == "collect":
                last.ready_at = max(last.ready_at, now + self.debounce)
            return
        if mergeable and lane.control is None and last is None:  # idle session
            lane.queue.append(_Batch([item], True, now + idle_debounce, True, idle_debounce))
            return
        ready = now + self.debounce if (mergeable and mode == "collect") else now
        lane.queue.append(_Batch([item], mergeable, ready))

    def abort(self, key: str, *, drop_queued: bool = False,
              reason: str = "stop") -> dict[str, Any]:
        """Stop the running turn of ``key`` (``/stop``): its task is cancelled at once (the
        turn pairs every started tool call with an ``aborted`` result; exec process groups
        are killed). Queued user messages stay and run next, or (``drop_queued``) are
        dropped, their callers getting TurnInterrupted. Returns ``{"aborted": bool,
        "queued": n kept, "dropped": n}``."""
        lane = self._lanes.get(key)
        out: dict[str, Any] = {"aborted": False, "queued": 0, "dropped": 0}
        if lane is None:
            return out
        control = lane.control
        waiting = [i for b in lane.queue if b.mergeable for i in b.items]
        waiting += control._steer if control is not None else []
        if drop_queued:
            lane.queue = deque(b for b in lane.queue if not b.mergeable)
            if control is not None:
                control._steer = []
            self._settle(waiting, ("ok", TurnInterrupted("dropped by /stop all")))
            out["dropped"] = len(waiting)
        else:
            out["queued"] = len(waiting)
        if control is not None and lane.task is not None and not control.aborted:
            control.aborted, control.abort_reason = True, reason
            lane.task.cancel()
            out["aborted"] = True
        log.info("lane_abort", session_key=key, **out)
        return out

    def _interrupt(self, lane: _Lane, item: _Item) -> None:
        assert lane.control is not None
        lane.control.aborted, lane.control.abort_reason = True, "interrupt"
        if lane.task is not None:
            lane.task.cancel()
        carried = [i for b in lane.queue if b.mergeable for i in b.items]
        others = [b for b in lane.queue if not b.mergeable]
        now = self.clock.monotonic()
        batches: list[_Batch] = []  # the carried messages and the new one, by route
        for i in [*carried, item]:
            if batches and batches[-1].takes(i):
                batches[-1].items.append(i)
            else:
                batches.append(_Batch([i], True, now))
        lane.queue = deque([*batches, *others])
        log.info("lane_interrupt", session_key=lane.key, carried=len(carried))

    # -- execution -----------------------------------------------------------------------
    async def _pump(self, lane: _Lane) -> None:
        try:
            while lane.queue:
                batch = lane.queue[0]
                while (wait := batch.ready_at - self.clock.monotonic()) > 0:
                    await self.clock.sleep(wait)
                lane.queue.popleft()
                await self._run_batch(lane, batch)
        finally:
            if not lane.queue and lane.control is None and self._lanes.get(lane.key) is lane:
                del self._lanes[lane.key]

    async def _run_batch(self, lane: _Lane, batch: _Batch) -> None:
        sem = self._sems[lane.kind]
        await sem.acquire()
        control = TurnControl(steerable=batch.mergeable, cap=sem,
                              route=batch.items[0].route)
        try:
            await self._run_controlled(lane, batch, control)
        finally:
            if control._cap is not None:  # not given back (or lost by a cancelled re-take)
                control._cap.release()

    async def _run_controlled(self, lane: _Lane, batch: _Batch, control: TurnControl) -> None:
        lane.control = control
        self._running[lane.kind] = self._running.get(lane.kind, 0) + 1
        me = asyncio.current_task()
        assert me is not None
        lane.task = me  # an interrupt cancels this pump task while the turn runs
        outcome: tuple[str, Any] = ("ok", None)
        try:
            # Awaited inline (no extra task): the turn's result reaches callers with
            # the fewest event-loop hops.
            with telemetry.turn(lane.kind, batch.items[0].queued_ns, len(batch.items),
                                lane.key):
                outcome = ("ok", await self.runner(lane.key,
                                                   [i.payload for i in batch.items], control))
        except asyncio.CancelledError:
            if not control.aborted or me.uncancel() > 0:
                self._settle(batch.items + control._taken + control._steer,
                             ("cancelled", None))
                raise  # shutdown (or an outer cancel): not an interrupt
            outcome = ("interrupted", TurnInterrupted() if control.abort_reason != "stop"
                       else TurnInterrupted("stopped (/stop)"))
        except Exception as exc:  # noqa: BLE001 - delivered to every waiting caller
            outcome = ("error", exc)
        finally:
            self._running[lane.kind] -= 1
            lane.control = None
            lane.task = None
        self._settle(batch.items + control._taken, outcome)
        if control._steer:  # steered too late for this turn: run them next
            lane.queue.appendleft(_Batch(control._steer, True, self.clock.monotonic()))

    @staticmethod
    def _settle(items: list[_Item], outcome: tuple[str, Any]) -> None:
        kind, value = outcome
        for item in items:
            if item.future.done():
                continue
            if kind == "cancelled":
                item.future.cancel()
            elif kind == "error":
                item.future.set_exception(value)
            else:
                item.future.set_result(value)

    # -- shutdown ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop intake: later ``submit`` calls raise LaneClosed."""
        self._closed = True

    async def drain(self, grace: float) -> int:
        """Wait up to ``grace`` seconds (this lane manager's clock) for running and queued
        turns; cancel what is left. Returns the number of lanes cancelled."""
        pumps = [lane.pump for lane in self._lanes.values() if lane.pump and not lane.pump.done()]
        if not pumps:
            return 0
        try:
            async with self.clock.timeout(grace):
                await asyncio.wait(pumps)  # unlike gather, a timeout does not cancel them
            return 0
        except TimeoutError:
            # Work that never started is handed back (``abandoned``) so the gateway can keep
            # it for the next start instead of losing it.
            for lane in list(self._lanes.values()):
                pending = [i for b in lane.queue for i in b.items]
                if lane.control is not None:
                    pending += lane.control._steer
                    lane.control._steer = []
                lane.queue.clear()
                for item in pending:
                    self.abandoned.append((lane.key, item.payload))
                    item.future.cancel()
            left = [p for p in pumps if not p.done()]
            for p in left:
                p.cancel()
            await asyncio.gather(*left, return_exceptions=True)
            return len(left)
