"""The heartbeat runner: wakes each agent that configures a heartbeat every ``every``
seconds to follow its workspace's HEARTBEAT.md (seed 001 §9.1-9.2; DESIGN.md "Scheduler").

A beat is skipped — with the reason logged — when the heartbeat is disabled, outside
``active_hours``, when HEARTBEAT.md exists but has nothing to act on (unless a system
event woke the beat), or when the session's lane is busy. Otherwise it runs the one turn
implementation in the agent's heartbeat session (default its main session) with the
transcript lines *held*: a reply that is a ``HEARTBEAT_OK`` ack drops them (the transcript
stays byte-for-byte unchanged and the session's ``updated_at`` is untouched), anything else
commits them and is delivered to the target (``none`` | ``last`` |
``<channel>:<to>[:<thread>]``) unless the same text was delivered for this agent in the
last 24 h. ``request_heartbeat_now`` coalesces bursts into one beat; every exit path
re-arms the interval timer. The gateway side (lanes, sessions, delivery, timeline) is
reached through :class:`HeartbeatHost`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from runtime.clock import SYSTEM_CLOCK, Clock, sleep_or_wake
from scheduler.heartbeat.rules import (
    DeliveryDeduper,
    default_heartbeat_prompt,
    heartbeat_file_is_empty,
    in_active_hours,
    strip_heartbeat_ack,
)

log = structlog.get_logger(__name__)
HANDED = "handed from another replica"  # run_once reason of a beat handed over (no slot)

COALESCE_S = 0.25     # requests within this window become one beat
BUSY_RETRY_S = 5.0    # a requested beat that found the lane busy tries again after this
WAKE_PREFIX = "system-event:"  # trigger of beats requested by a wake=True system event


@dataclass(slots=True)
class HeartbeatAgent:
    """One agent's heartbeat settings (resolved from config by the gateway)."""

    agent_id: str
    every: float
    session_key: str
    workspace: Path
    target: str = "none"
    prompt: str | None = None
    model: str | None = None
    ack_max_chars: int = 300
    active_start: str | None = None
    active_end: str | None = None
    active_tz: str = "UTC"
    timeout: float | None = None


@dataclass(slots=True)
class BeatOutcome:
    """``outcome``: skipped | ok | alert | delivered | duplicate | error.
    ``reason`` explains skips and undelivered alerts."""

    agent_id: str
    outcome: str
    reason: str | None = None
    text: str | None = None
    duration_ms: float = 0.0


class HeartbeatHost(Protocol):
    """What the runner needs from the gateway."""

    def is_busy(self, session_key: str) -> bool: ...

    async def run_beat(self, agent: HeartbeatAgent, prompt: str,
                       decide: Any) -> Any:
        """Run a held turn in the lane of ``agent.session_key``; ``decide(result) -> bool``
        says whether to keep its transcript lines. Returns the TurnResult."""

    def last_route(self, agent_id: str, session_key: str) -> Any: ...

    async def deliver(self, agent_id: str, target: Any, text: str) -> bool: ...

    def record(self, agent_id: str, session_key: str, content: dict[str, Any]) -> None: ...


@dataclass
class _State:
    agent: HeartbeatAgent
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    requested: str | None = None
    task: asyncio.Task | None = None
    last_run: float | None = None
    beats: int = 0


class HeartbeatRunner:
    """Runs the heartbeat of every configured agent (one beat per agent per interval)."""

    def __init__(self, host: HeartbeatHost, agents: list[HeartbeatAgent], *,
                 clock: Clock = SYSTEM_CLOCK, deduper: DeliveryDeduper | None = None) -> None:
        self.host = host
        self.clock = clock
        # ``is None``, not ``or``: an empty ledger has len 0 and is falsy, and replacing it
        # with a memory-only one meant delivered.json was never written (alerts repeated
        # after every restart)
        self.deduper = deduper if deduper is not None else DeliveryDeduper(clock)
        self._states = {a.agent_id: _State(a) for a in agents}
        self._stopping = False
        self._unreadable: set[str] = set()  # agents whose HEARTBEAT.md failure was logged
        self.outcomes: list[BeatOutcome] = []  # the last few, for status and tests
        self.on_outcome: list[Callable[[BeatOutcome], None]] = []  # observers (metrics)
        # Replicas: ``await slot_gate(agent_id, now, every)`` is False when another replica
        # already beat for this agent in this slot (gateway/cluster/occurrences.py).
        self.slot_gate: Callable[[str, float, float], Awaitable[bool]] | None = None
        self._handed: set[asyncio.Task] = set()  # beats handed over by another replica

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        for st in self._states.values():
            if st.agent.every > 0:
                st.task = asyncio.get_running_loop().create_task(self._loop(st))
        log.info("heartbeat_started", agents=[a for a, s in self._states.items()
                                              if s.agent.every > 0])

    async def stop(self) -> None:
        self._stopping = True
        tasks = [s.task for s in self._states.values() if s.task is not None]
        tasks += list(self._handed)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def agent_for_session(self, session_key: str) -> str | None:
        return next((a for a, s in self._states.items() if s.agent.session_key == session_key),
                    None)

    def request_heartbeat_now(self, agent_id: str, reason: str = "requested") -> bool:
        """Run a beat for ``agent_id`` soon; a burst of requests becomes one beat.
        Returns False when the agent has no (enabled) heartbeat."""
        st = self._states.get(agent_id)
        if st is None or st.agent.every <= 0 or st.task is None:
            log.info("heartbeat_skipped", agent=agent_id, reason="disabled", trigger=reason)
            return False
        if st.requested is None or (reason.startswith(WAKE_PREFIX)
                                    and not st.requested.startswith(WAKE_PREFIX)):
            st.requested = reason  # a wake's reason wins: it lets an empty HEARTBEAT.md run
        st.wake.set()
        return True

    def status(self) -> dict[str, Any]:
        return {a: {"every_s": s.agent.every, "beats": s.beats,
                    "last_run": s.last_run, "session_key": s.agent.session_key}
                for a, s in self._states.items()}

    # -- the per-agent timer ---------------------------------------------------------------
    async def _loop(self, st: _State) -> None:
        while not self._stopping:
            reason = await self._wait(st)
            try:
                outcome = await self.run_once(st.agent.agent_id, reason)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed beat must re-arm the timer
                log.exception("heartbeat_failed", agent=st.agent.agent_id)
                outcome = BeatOutcome(st.agent.agent_id, "error", str(exc))
            if (outcome.outcome == "skipped" and outcome.reason == "busy"
                    and reason != "interval"):
                st.requested = st.requested or reason  # a wake must not be lost to a busy lane
                await self.clock.sleep(BUSY_RETRY_S)

    async def _wait(self, st: _State) -> str:
        """Sleep until the interval elapses (from the last run) or a request arrives."""
        if st.requested is None:
            base = st.last_run if st.last_run is not None else self.clock.monotonic()
            remaining = base + st.agent.every - self.clock.monotonic()
            if remaining > 0:
                await sleep_or_wake(self.clock, st.wake, remaining)
        if st.requested is not None:
            await self.clock.sleep(COALESCE_S)  # let a burst of requests collapse
        reason, st.requested = st.requested or "interval", None
        st.wake.clear()
        return reason

    def run_handed(self, agent_id: str) -> bool:
        """Replicas: run a beat of ``agent_id`` here, in the background, without claiming
        its slot: another replica's timer claimed it and handed the beat to this replica,
        which holds the session's lane (gateway/cluster/synthetic.py). False for an agent
        without a heartbeat here."""
        if agent_id not in self._states:
            return False
        task = asyncio.get_running_loop().create_task(self.run_once(agent_id, HANDED))
        self._handed.add(task)
        task.add_done_callback(self._handed.discard)
        return True

    # -- one beat ------------------------------------------------------------------------
    async def run_once(self, agent_id: str, reason: str = "interval") -> BeatOutcome:
        """Evaluate and (unless skipped) run one beat now. Never raises for turn failures."""
        st = self._states[agent_id]
        agent = st.agent
        t0 = time.perf_counter()
        st.last_run = self.clock.monotonic()
        outcome = await self._beat(agent, reason)
        outcome.duration_ms = (time.perf_counter() - t0) * 1000
        st.beats += 1
        self.outcomes = (self.outcomes + [outcome])[-50:]
        for observe in self.on_outcome:
            observe(outcome)
        log.info("heartbeat", agent=agent_id, outcome=outcome.outcome, reason=outcome.reason,
                 trigger=reason, duration_ms=round(outcome.duration_ms, 2),
                 session_key=agent.session_key)
        if outcome.outcome != "skipped" or outcome.reason == "busy":
            self.host.record(agent_id, agent.session_key, {
                "outcome": outcome.outcome, "reason": outcome.reason, "trigger": reason,
                "reply": outcome.text, "duration_ms": int(outcome.duration_ms)})
        return outcome

    async def _beat(self, agent: HeartbeatAgent, reason: str) -> BeatOutcome:
        aid = agent.agent_id
        if agent.every <= 0:
            return BeatOutcome(aid, "skipped", "disabled")
        if agent.active_start and agent.active_end and not in_active_hours(
                self.clock.time(), agent.active_start, agent.active_end, agent.active_tz):
            return BeatOutcome(aid, "skipped", "quiet_hours")
        hb_text = self._read_heartbeat_file(agent)
        # An empty HEARTBEAT.md saves the model call of a routine beat; a beat woken by a
        # system event (exec finished, a cron main job) has that event to act on.
        if hb_text is not None and heartbeat_file_is_empty(hb_text) \
                and not reason.startswith(WAKE_PREFIX):
            return BeatOutcome(aid, "skipped", "empty_heartbeat_file")
        if self.host.is_busy(agent.session_key):
            return BeatOutcome(aid, "skipped", "busy")
        if self.slot_gate is not None and reason != HANDED and not await self.slot_gate(
                aid, self.clock.time(), agent.every):
            return BeatOutcome(aid, "skipped", "slot_taken")  # another replica beat
        prompt = agent.prompt or default_heartbeat_prompt()
        if hb_text and not agent.prompt:
            prompt += f"\n\nHEARTBEAT.md:\n{hb_text.strip()}"
        verdict: dict[str, Any] = {}

        def decide(result: Any) -> bool:
            if result.status == "skipped":  # the gate stopped it (a budget): no trace
                verdict["skipped"] = result.error or "skipped"
                return False
            if result.status != "ok":
                verdict["error"] = result.error or result.status
                return True  # keep the record of a failed beat
            ack = strip_heartbeat_ack(result.text, agent.ack_max_chars)
            verdict["ack"], verdict["text"] = ack.is_ack, ack.remaining
            return not ack.is_ack

        result = await self.host.run_beat(agent, prompt, decide)
        if "skipped" in verdict:
            return BeatOutcome(aid, "skipped", verdict["skipped"])
        if "error" in verdict or not hasattr(result, "status"):
            return BeatOutcome(aid, "error", str(verdict.get("error", "interrupted")))
        if verdict.get("ack"):
            return BeatOutcome(aid, "ok", text=verdict.get("text") or None)
        return await self._deliver(agent, verdict.get("text") or "")

    def _read_heartbeat_file(self, agent: HeartbeatAgent) -> str | None:
        """HEARTBEAT.md's text, or None when it is missing — or unreadable (a directory,
        no permission, an I/O error): that is logged once (until it reads again) and the
        beat follows the missing-file rule, so an odd file never stops the heartbeat."""
        path = agent.workspace / "HEARTBEAT.md"
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            text = None
        except OSError as exc:
            if agent.agent_id not in self._unreadable:
                self._unreadable.add(agent.agent_id)
                log.error("heartbeat_file_unreadable", agent=agent.agent_id, path=str(path),
                          error=f"{type(exc).__name__}: {exc.strerror or exc}",
                          fix="make HEARTBEAT.md a readable file, or remove it; beats go on "
                              "as if it were missing")
            return None
        self._unreadable.discard(agent.agent_id)
        return text

    async def _deliver(self, agent: HeartbeatAgent, text: str) -> BeatOutcome:
        aid = agent.agent_id
        if not text.strip():
            return BeatOutcome(aid, "ok", "empty_reply")
        if agent.target == "none":
            return BeatOutcome(aid, "alert", "target_none", text)
        if self.deduper.seen(aid, text):
            return BeatOutcome(aid, "duplicate", "same_text_within_24h", text)
        if agent.target == "last":
            target = self.host.last_route(aid, agent.session_key)
            if target is None:
                log.warning("heartbeat_no_route", agent=aid, session_key=agent.session_key)
                return BeatOutcome(aid, "alert", "no_last_route", text)
        else:
            target = agent.target
        if await self.host.deliver(aid, target, text):
            self.deduper.record(aid, text)
            return BeatOutcome(aid, "delivered", text=text)
        return BeatOutcome(aid, "alert", "delivery_failed", text)
