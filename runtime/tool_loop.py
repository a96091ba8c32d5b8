"""Tool-loop detection (seed 001 §9.5, OpenClaw's tool-loop-detection).

Within one run, a call counts as a repeat when it has the same tool, the same arguments
and the same result as the call before it, or — a two-tool ping-pong — as the call two
before it (A, B, A, B ...). The count resets when the result changes. At ``warning`` (10)
the model gets a note to change approach (and a log line); at ``critical`` (20) the run
stops with a notice to the user. Every repeat also feeds a gateway-wide breaker: ``global``
(30) repeats of one tool within ``global_reset`` (10 min), from any sessions, pause that
tool for every run for ``global_reset``; ``tidegate status`` shows it while it lasts.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import Field, model_validator

from runtime.clock import Clock, utc_iso
from runtime.config_types import ConfigModel, Duration

log = structlog.get_logger(__name__)


class ToolLoopConfig(ConfigModel):
    """``agents.*.tool_loop``: thresholds in calls (see module docstring)."""

    enabled: bool = Field(
        True,
        description="Detect and stop tool loops.")
    warning: int = Field(10, ge=2,
        description="the model is told to change approach.")
    critical: int = Field(20, ge=2,
        description="the run stops and the user gets a notice.")
    global_limit: int = Field(30, ge=2, alias="global",
        description=("repeats of one tool across all sessions within global_reset pause it "
                     "gateway-wide."))
    global_reset: Duration = Field(
        600.0,
        description="how long the breaker counts and pauses.")

    @model_validator(mode="after")
    def _ordered(self) -> ToolLoopConfig:
        if self.warning > self.critical:
            raise ValueError("warning: must not exceed critical")
        return self


@dataclass(slots=True)
class LoopVerdict:
    """``level`` ok | warn | block; ``count`` the length of the repeating run of calls;
    ``pattern`` repeat | ping-pong."""

    level: str
    count: int = 0
    pattern: str = "repeat"


class LoopBreaker:
    """The gateway-wide breaker (one per gateway, shared by every agent)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._hits: dict[str, deque[float]] = {}
        self._tripped: dict[str, float] = {}  # tool -> monotonic time it resets

    def paused(self, tool: str) -> float:
        """Seconds the tool stays paused (0 = free)."""
        until = self._tripped.get(tool)
        if until is None:
            return 0.0
        left = until - self.clock.monotonic()
        if left <= 0:
            del self._tripped[tool]
            log.info("tool_loop_breaker_reset", tool=tool)
            return 0.0
        return left

    def hit(self, tool: str, *, limit: int, window: float, session_key: str) -> bool:
        """Count one repeat of ``tool``; True when it trips the breaker."""
        now = self.clock.monotonic()
        hits = self._hits.setdefault(tool, deque())
        hits.append(now)
        while hits and hits[0] <= now - window:
            hits.popleft()
        if len(hits) < limit or self.paused(tool):
            return False
        hits.clear()
        self._tripped[tool] = now + window
        log.error("tool_loop_breaker_tripped", tool=tool, repeats=limit, reset_s=window,
                  session_key=session_key)
        return True

    def status(self) -> dict[str, Any]:
        """``{tool: {"reset_in_s", "resets_at"}}`` for every paused tool."""
        out = {}
        for tool in list(self._tripped):
            left = self.paused(tool)
            if left:
                out[tool] = {"reset_in_s": round(left),
                             "resets_at": utc_iso(self.clock.time() + left)}
        return out

    def problems(self) -> list[str]:
        return [f"tool loop breaker: {tool} paused gateway-wide for {info['reset_in_s']}s "
                f"more" for tool, info in self.status().items()]


class LoopDetector:
    """One run's detector. ``observe`` after each executed call."""

    def __init__(self, cfg: ToolLoopConfig, breaker: LoopBreaker | None,
                 session_key: str = "") -> None:
        self.cfg, self.breaker, self.session_key = cfg, breaker, session_key
        self._sigs: list[str] = []
        self._streak = 0
        self._alt = 0

    def observe(self, name: str, arguments: dict[str, Any], result: str) -> LoopVerdict:
        if not self.cfg.enabled:
            return LoopVerdict("ok")
        sig = hashlib.sha256(json.dumps([name, arguments, result], sort_keys=True,
                                        default=str).encode()).hexdigest()
        h = self._sigs
        self._streak = self._streak + 1 if h and h[-1] == sig else 1
        if len(h) >= 2 and h[-2] == sig and h[-1] != sig:
            self._alt = self._alt + 1 if self._alt >= 2 else 3
        else:
            self._alt = 2 if h and h[-1] != sig else 0
        h.append(sig)
        del h[:-2]
        count, pattern = max((self._streak, "repeat"), (self._alt, "ping-pong"))
        if (self._streak >= 2 or self._alt >= 3) and self.breaker is not None:
            self.breaker.hit(name, limit=self.cfg.global_limit, window=self.cfg.global_reset,
                             session_key=self.session_key)
        if count >= self.cfg.critical:
            log.error("tool_loop_blocked", tool=name, count=count, pattern=pattern,
                      session_key=self.session_key)
            return LoopVerdict("block", count, pattern)
        if count == self.cfg.warning:
            log.warning("tool_loop_warning", tool=name, count=count, pattern=pattern,
                        session_key=self.session_key)
            return LoopVerdict("warn", count, pattern)
        return LoopVerdict("ok", count, pattern)


def warning_note(name: str, verdict: LoopVerdict) -> str:
    """The note appended to the tool result at the warning threshold."""
    what = ("the same arguments and got the same result" if verdict.pattern == "repeat"
            else "alternating with another tool, with the same arguments and results")
    return (f"\n\n[tidegate: you have called {name} {verdict.count} times in a row with "
            f"{what}. This is a loop: change approach or answer the user.]")


BLOCK_NOTICE = ("I stopped because I kept repeating the same tool call without getting "
                "anywhere. Please rephrase or give me more to go on.")
