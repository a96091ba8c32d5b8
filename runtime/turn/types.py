"""What a turn takes and gives back (runtime/turn/runner.py runs it): the user messages of
a lane batch, the turn's input, its result, and the usage arithmetic of its model calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.ids import unique_hex
from runtime.providers.base import Usage

if TYPE_CHECKING:
    from runtime.media.ref import MediaRef

Recorder = Callable[[str, str, dict[str, Any]], None]
ABORTED = "aborted: the turn was stopped before this tool call finished"


@dataclass(slots=True)
class UserText:
    """One inbound user message of a turn (several when the lane merged a burst).
    ``logged``: already in the transcript (a turn resumed after a crash): not appended."""

    text: str
    sender: str | None = None
    message_id: str | None = None
    received_at: float | None = None
    media: list[MediaRef] = field(default_factory=list)
    logged: bool = False


@dataclass(slots=True)
class TurnInput:
    """Everything a turn needs besides the agent. ``trigger`` is user|heartbeat|cron|system.

    ``prompt`` is a gateway-generated instruction (heartbeat/cron) recorded as a user
    message; ``system_events`` is the rendered, already-drained events section.
    """

    session_key: str
    session_id: str
    run_id: str = field(default_factory=lambda: unique_hex(12))
    messages: list[UserText] = field(default_factory=list)
    trigger: str = "user"
    prompt: str | None = None
    system_events: str = ""
    model: str | None = None
    session_started_at: float | None = None
    last_user_at: float | None = None
    environment: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None
    steer_text: Callable[[Any], UserText] | None = None
    stream: bool = False  # the caller consumes text deltas (also: a live delta subscriber)
    tool_scope: Any = None
    guidance: str = ""  # gateway-written note for this kind of chat (prompt "# Chat")
    memory: str = ""  # the sender's memory section (gateway/memory/hub.py prompt_notes)
    reasoning: str | None = None  # /think level: low | medium | high (None: off)
    tainted_by: list[str] = field(default_factory=list)  # untrusted input of the turn
    # what the drained system events taint the turn with (a background command that a
    # tainted turn started): added to the taint and journaled at the turn's start
    event_taint: list[str] = field(default_factory=list)
    # the sender the turn acts for when it is not an owner ("telegram:666"): sandbox
    # mode non-main sandboxes its commands even in the main session (docs/exec.md)
    stranger: str | None = None
    client_tools: list[Any] = field(default_factory=list)  # ToolSpecs the caller runs
    tool_results: list[dict[str, Any]] = field(default_factory=list)  # its results
    # replicas: asked before each model round whether the session's lane is still run
    # here; False (or an awaitable of False) ends the turn before the call (LANE_GONE)
    lane_held: Callable[[], Any] | None = None


class Refused(Exception):
    """The gate refused the next model call (a budget is used up)."""


LANE_GONE = "lane_gone"  # TurnResult.error_class of a turn ended by ``lane_held``


class LaneGone(Exception):
    """The session's lane is no longer run by this process (another replica took it over
    while this one was paused or cut off): the turn ends before its next model call."""


@dataclass(slots=True)
class TurnResult:
    """Outcome of a turn. ``status``: ok | error | timeout | aborted | refused (a user turn
    the gate stopped; ``text`` is the notice) | skipped (background work the gate stopped;
    ``error`` says why). Durations in ms."""

    run_id: str
    session_key: str
    session_id: str
    status: str
    text: str
    error: str | None = None
    error_class: str | None = None  # a failed model call's class (failover/errors.py)
    retry_after: float | None = None  # seconds until a rate limit lifts, when known
    model: str = ""
    provider: str = ""
    profile: str = ""
    usage: Usage = field(default_factory=Usage)
    tool_calls: int = 0
    rounds: int = 0
    duration_ms: float = 0.0
    model_ms: float = 0.0
    client_calls: list[Any] = field(default_factory=list)  # ToolCalls for the caller to run
    notes: list[str] = field(default_factory=list)  # ModelResponse.notes, shown after text
    tainted_by: list[str] = field(default_factory=list)  # what tainted the turn by its end


def usage_dict(u: Usage) -> dict[str, int]:
    return {"input": u.input_tokens, "output": u.output_tokens,
            "cacheRead": u.cache_read_tokens, "cacheWrite": u.cache_write_tokens,
            "totalTokens": u.total_tokens}


def add_usage(total: Usage, u: Usage) -> None:
    total.input_tokens += u.input_tokens
    total.output_tokens += u.output_tokens
    total.cache_read_tokens += u.cache_read_tokens
    total.cache_write_tokens += u.cache_write_tokens

