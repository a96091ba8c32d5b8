"""The turn runner: :class:`AgentRunner` runs one turn of one agent, model round after
model round (runtime/turn/__init__.py describes the whole turn; tool calls:
runtime/turn/tools.py; compaction: runtime/turn/compact.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from runtime import telemetry
from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.context.budget import CHARS_PER_TOKEN, estimate_tokens, fit_to_budget
from runtime.context.guard import ContextWindowGuard
from runtime.context.messages import (
    assistant_message,
    memory_owner,
    private_view,
    tool_result_message,
    user_message,
)
from runtime.context.session_log import HeldLog, LogSink, SessionLog
from runtime.durability import TurnBatch
from runtime.events import EventBus, RuntimeEvent
from runtime.lanes import TurnControl
from runtime.neutralize import neutralize_user_text
from runtime.prompt import PromptBuilder
from runtime.providers.base import THINKING_BUDGETS, ChatMessage, ModelRequest, ToolCall
from runtime.providers.failover.chain import AttemptBudget, ModelCaller, ModelCallError
from runtime.providers.failover.errors import user_notice
from runtime.tool_loop import BLOCK_NOTICE, LoopBreaker, LoopDetector, warning_note
from runtime.tools.policy import Resolution
from runtime.tools.registry import ToolContext
from runtime.turn.client_tools import answer_waiting, offered, split, take_waiting, wait_for
from runtime.turn.compact import maybe_compact
from runtime.turn.deadline import published as deadline_published
from runtime.turn.tools import close_pending, execute, keep_taint
from runtime.turn.types import (
    ABORTED,
    LANE_GONE,
    LaneGone,
    Recorder,
    Refused,
    TurnInput,
    TurnResult,
    add_usage,
    usage_dict,
)
from runtime.turn.user_input import append_user, record_input

SILENT_TOKENS = ("NO_REPLY", "HEARTBEAT_OK")  # channels/outbound/silent.py decides delivery
FAILED = ("error", "timeout")  # turn statuses whose trace root is marked ERROR


def _silent(text: str) -> bool:
    """A reply the channels may show as nothing: notes are never appended to it."""
    return any(t in text for t in SILENT_TOKENS)


log = structlog.get_logger(__name__)


LANE_RECHECK_S = 0.5  # s since a round's lane check after which its attempt asks again


async def _lane_still_held(inp: TurnInput) -> None:
    """Raise :class:`LaneGone` when ``inp.lane_held`` says the session's lane moved away
    (replicas): no model call is made for a session another replica now runs."""
    if inp.lane_held is None:
        return
    held = inp.lane_held()
    if inspect.isawaitable(held):
        held = await held
    if not held:
        raise LaneGone("the session's lane was taken over by another replica")


@dataclass(slots=True)
class _Context:
    """What every model round of a turn shares: the prompt, the token budget, how many
    new messages this turn wrote, and the messages the model sees (grown each round)."""

    system: str
    dynamic: str
    budget: int
    n_new: int
    messages: list[ChatMessage]


class AgentRunner:
    """Runs turns for one agent. Long-lived: holds the prompt builder and tool list."""

    def __init__(self, *, agent_id: str, settings: Any, prompt: PromptBuilder,
                 tools: Callable[[TurnInput], Resolution], caller: ModelCaller, bus: EventBus,
                 tool_context: Callable[[str, str | None], ToolContext], clock: Clock = SYSTEM_CLOCK,
                 recorder: Recorder | None = None, guard: ContextWindowGuard | None = None,
                 breaker: LoopBreaker | None = None,
                 gate: Callable[[str, str], str | None] | None = None,
                 batching: Any = None) -> None:
        self.agent_id = agent_id
        self.settings = settings
        self.prompt = prompt
        self.caller = caller
        self.bus = bus
        self.clock = clock
        self.recorder = recorder
        self.batching = batching  # hold/release of recorded events (runtime/durability.py)
        self.tool_context = tool_context
        self.guard = guard
        self.breaker = breaker
        # gate(agent_id, trigger) -> a refusal notice, checked before every model call
        # (budgets: gateway/usage.py).
        self.gate = gate
        self.resolve_tools = tools  # the policy pipeline's cached set for the turn's scope

    # -- helpers -------------------------------------------------------------------------
    def emit(self, inp: TurnInput, etype: str, **data: Any) -> None:
        self.bus.emit(RuntimeEvent(etype, inp.run_id, inp.session_key, self.agent_id,
                                   self.clock.time(), data))

    def record(self, session_id: str, etype: str, content: dict[str, Any]) -> None:
        if self.recorder is not None:
            self.recorder(session_id, etype, content)

    def now_ms(self) -> int:
        return int(self.clock.time() * 1000)

    # -- the turn ------------------------------------------------------------------------
    async def run(self, inp: TurnInput, sink: LogSink,
                  history: list[ChatMessage] | None = None,
                  control: TurnControl | None = None) -> TurnResult:
        """Run one turn. The context comes from ``sink`` when it is a SessionLog (or a
        HeldLog over one); other sinks use ``history``. Never raises for model/tool
        failures (status says what happened); re-raises CancelledError after writing what
        is needed to keep the transcript valid.
        """
        t0 = time.perf_counter()
        result = TurnResult(inp.run_id, inp.session_key, inp.session_id, "ok", "")
        self.emit(inp, "agent_start", trigger=inp.trigger)
        pending: list[ToolCall] = []
        timeout = inp.timeout if inp.timeout is not None else self.settings.timeout
        refused = self._refusal(inp)
        if refused is not None:  # before anything is written: no trace of a refused turn
            self._refuse(inp, result, refused)
            self._finish(inp, result, t0)
            return result
        with TurnBatch(sink, self.batching, inp.session_id) as batch:
            return await self._run_batched(inp, sink, history, control, result, pending,
                                           timeout, t0, batch)

    async def _run_batched(self, inp: TurnInput, sink: LogSink,
                           history: list[ChatMessage] | None, control: TurnControl | None,
                           result: TurnResult, pending: list[ToolCall], timeout: float,
                           t0: float, batch: TurnBatch) -> TurnResult:
        try:
            async with self.clock.timeout(timeout or None) as limit:
                with deadline_published(limit):  # an approval wait pauses it
                    await self._loop(inp, sink, history, control, result, pending, batch)
        except Refused as stop:
            self._refuse(inp, result, str(stop))
        except LaneGone as gone:  # another replica runs the session now: it answers
            log.warning("turn_lane_gone", run_id=inp.run_id, session_key=inp.session_key,
                        round=result.rounds, reason=str(gone))
            result.status, result.error, result.error_class = "aborted", str(gone), LANE_GONE
        except TimeoutError:
            close_pending(self, inp, sink, pending, "error: the turn timed out")
            result.status = "timeout"
            result.error = f"turn timed out after {timeout:g}s"
            result.text = result.text or f"(The turn timed out after {timeout:g}s.)"
        except asyncio.CancelledError:
            reason = getattr(control, "abort_reason", None) or "cancelled"
            self.record(inp.session_id, "SYSTEM_EVENT", {
                "kind": "turn_aborted", "run_id": inp.run_id, "reason": reason,
                "tool_calls_aborted": [c.id for c in pending]})
            close_pending(self, inp, sink, pending, ABORTED, aborted=True)
            result.status = "aborted"
            self._finish(inp, result, t0)
            raise
        except ModelCallError as exc:  # expected upstream trouble: logged without traceback
            close_pending(self, inp, sink, pending, "error: the model call failed")
            log.warning("turn_failed", run_id=inp.run_id, session_key=inp.session_key,
                        error_class=exc.error_class, error=str(exc)[:1000])
            result.status, result.error = "error", str(exc)
            result.error_class, result.retry_after = exc.error_class, exc.wait_s
            result.text = exc.notice
        except Exception as exc:
            close_pending(self, inp, sink, pending, f"error: {exc}")
            log.exception("turn_failed", run_id=inp.run_id, session_key=inp.session_key)
            result.status = "error"
            result.error = str(exc)
            result.text = "Sorry — something went wrong on my side; the operator has been told."
        self._finish(inp, result, t0)
        return result

    def _refusal(self, inp: TurnInput) -> str | None:
        return self.gate(self.agent_id, inp.trigger) if self.gate is not None else None

    @staticmethod
    def _refuse(inp: TurnInput, result: TurnResult, notice: str) -> None:
        """A user turn gets the notice as its reply (status ``refused``); background work
        is ``skipped`` with the notice as the reason and says nothing."""
        result.error = notice
        if inp.trigger == "user":
            result.status, result.text = "refused", notice
        else:
            result.status, result.text = "skipped", ""

    def _finish(self, inp: TurnInput, result: TurnResult, t0: float) -> None:
        result.duration_ms = (time.perf_counter() - t0) * 1000
        telemetry.annotate({"tidegate.agent": self.agent_id, "tidegate.turn.trigger":
                            inp.trigger, "tidegate.turn.status": result.status,
                            "tidegate.turn.tool_calls": result.tool_calls})
        if result.status in FAILED:  # the root span's status, by class only
            telemetry.fail(result.error_class or result.status)
        self.emit(inp, "agent_end", status=result.status, text=result.text, error=result.error,
                   duration_ms=result.duration_ms, model_ms=result.model_ms,
                   usage=usage_dict(result.usage), trigger=inp.trigger)

    async def _loop(self, inp: TurnInput, sink: LogSink, history: list[ChatMessage] | None,
                    control: TurnControl | None, result: TurnResult,
                    pending: list[ToolCall], batch: TurnBatch) -> None:
        c = await self._prepare(inp, sink, history, result, batch)
        if c is None:
            return
        ctx = self.tool_context(inp.session_key, inp.stranger)
        tools = self.resolve_tools(inp)
        ctx.scope = inp.tool_scope if inp.tool_scope is not None else tools.scope
        # grows as untrusted tool results arrive; what drained system events brought
        # (a command a tainted turn started) is journaled like a tool's taint
        ctx.taint = list(dict.fromkeys([*inp.tainted_by, *inp.event_taint]))
        result.tainted_by = ctx.taint  # the same list: it grows with the turn's taint
        await keep_taint(self, inp, ctx, inp.event_taint)
        ctx.extra["run_id"] = inp.run_id  # an approval is used only by the turn that asked
        specs, client_names = offered(tools.specs, inp.client_tools)
        if client_names:
            tools = dataclasses.replace(tools, specs=specs)
        loops = LoopDetector(self.settings.tool_loop, self.breaker, inp.session_key)
        attempts = self.caller.budget(self.settings.timeout if inp.timeout is None
                                      else inp.timeout)
        for round_no in range(1, self.settings.max_tool_rounds + 1):
            result.rounds = round_no
            if control is not None and round_no > 1 and inp.steer_text is not None:
                steered = control.take_steer()
                for payload in steered:
                    append_user(self, inp, sink, c.messages, inp.steer_text(payload))
                if steered:
                    batch.flush_input()
                    await batch.input_stored()
            resp = await self._model_round(inp, sink, c, tools, attempts, control, result,
                                           round_no)
            if not resp.tool_calls:
                return
            own, theirs = split(resp.tool_calls, client_names)
            if theirs:  # answered by the caller's next request (runtime/turn/client_tools.py)
                wait_for(inp.session_id, theirs)
            pending[:] = own
            batch.flush()  # the calls are on disk before their side effects
            if own and await self._tool_round(inp, sink, c.messages, ctx, tools, loops,
                                              own, pending, result):
                result.status, result.error = "error", "tool loop detected"
                result.text = BLOCK_NOTICE
                return
            if theirs:
                result.client_calls = theirs
                return
        note = f"(Stopped after {self.settings.max_tool_rounds} tool rounds.)"
        result.text = f"{result.text}\n\n{note}".strip()
        result.status = "error"
        result.error = "tool round limit reached"

    async def _prepare(self, inp: TurnInput, sink: LogSink,
                       history: list[ChatMessage] | None, result: TurnResult,
                       batch: TurnBatch) -> _Context | None:
        """The prompt and the budget; this turn's user messages written; the context the
        model sees (compacted first when it nears the budget). None: the context window
        guard refused the model (``result`` says so)."""
        system = self.prompt.stable_prefix()
        dynamic = PromptBuilder.dynamic_block(
            now=self.clock.time(), tz=self.settings.user_timezone,
            session_started_at=inp.session_started_at, last_user_at=inp.last_user_at,
            environment=inp.environment, system_events=inp.system_events,
            guidance=inp.guidance, memory=inp.memory)
        verdict = self.guard.verdict(inp.model or self.caller.chain[0]) if self.guard else None
        window = min(self.settings.context_tokens, verdict.window if verdict else 1 << 30)
        thinking = THINKING_BUDGETS.get(inp.reasoning or "", 0)  # /think spends output tokens
        budget = max(window - self.settings.max_tokens - thinking
                     - (len(system) + len(dynamic)) // 4 - 256, 512)
        new: list[ChatMessage] = []
        waiting = take_waiting(inp.session_id)
        if waiting:  # the last turn asked the client to run tools: their results first
            answer_waiting(self, inp, sink, waiting, new)
        share = max(1, len(inp.messages) + (1 if inp.prompt else 0))
        max_chars = budget * CHARS_PER_TOKEN // (2 * share)  # new messages: half the budget
        for u in inp.messages:
            if not u.logged:
                append_user(self, inp, sink, new, u, max_chars)
            else:  # re-run after a crash: the line is in the transcript (stored before
                # the model call), the turn's held events were not
                record_input(self, inp, u, neutralize_user_text(u.text))
        if inp.prompt:
            sink.append_message(user_message(inp.prompt, self.now_ms(), trigger=inp.trigger))
            self.record(inp.session_id, "USER_INPUT", {"text": inp.prompt,
                                                      "trigger": inp.trigger})
            new.append(ChatMessage(role="user", content=inp.prompt))
        batch.flush_input()
        await batch.input_stored()
        if verdict is not None and verdict.level == "refuse":
            log.error("context_guard_refused", run_id=inp.run_id, session_key=inp.session_key,
                      model=verdict.ref, window=verdict.window, error=verdict.message)
            result.status, result.error = "error", verdict.message
            result.error_class = "context_guard"
            result.text = user_notice("context_guard")
            return None
        if isinstance(sink, SessionLog):
            if self.settings.compaction.enabled:
                await maybe_compact(self, inp, sink, len(new), budget)
            # this turn's messages are the newest entries
            messages = sink.context(budget, self.settings.history_turns)
        elif isinstance(sink, HeldLog):
            reserve = sum(estimate_tokens(m) for m in new)
            turns = self.settings.history_turns
            messages = sink.target.context(budget - reserve, max(1, turns - len(new))
                                           if turns else 0) + new
        else:
            messages = fit_to_budget((history or []) + new, budget)
        messages = private_view(messages, getattr(inp.tool_scope, "asker", None))
        return _Context(system, dynamic, budget, len(new), messages)

    async def _model_round(self, inp: TurnInput, sink: LogSink, c: _Context,
                           tools: Resolution, attempts: AttemptBudget,
                           control: TurnControl | None, result: TurnResult,
                           round_no: int) -> Any:
        """One model call and its answer written (transcript, timeline, events)."""
        # Streaming costs CPU per chunk: only when someone consumes the deltas.
        stream = inp.stream or self.bus.wants_deltas(inp.run_id)
        request = ModelRequest(
            model="", system=c.system, system_dynamic=c.dynamic, messages=c.messages,
            tools=tools.specs, max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature, stream=stream, reasoning=inp.reasoning)
        if round_no > 1 and (refused := self._refusal(inp)) is not None:
            raise Refused(refused)
        await _lane_still_held(inp)
        checked = [self.clock.monotonic()]
        self.emit(inp, "message_start", round=round_no)
        resp, model_ms = await self._call_model(inp, sink, request, attempts, c.budget,
                                                c.n_new, control, self._recheck(inp, checked))
        result.model_ms += model_ms
        result.model, result.provider = resp.model, resp.provider
        result.profile = resp.auth_profile
        add_usage(result.usage, resp.usage)
        sink.append_message(assistant_message(
            resp.text, resp.tool_calls, self.now_ms(), api=resp.api,
            provider=resp.provider, model=resp.model, usage=usage_dict(resp.usage),
            stopReason="toolUse" if resp.tool_calls else resp.stop_reason))
        self.record(inp.session_id, "LLM_RESPONSE", {
            "text": resp.text, "model": resp.model, "provider": resp.provider,
            "profile": resp.auth_profile,
            "tool_calls": [{"id": t.id, "name": t.name, "arguments": t.arguments}
                           for t in resp.tool_calls],
            "usage": usage_dict(resp.usage), "stop_reason": resp.stop_reason,
            "model_ms": round(model_ms, 2)})
        self.emit(inp, "message_end", text=resp.text, tool_calls=len(resp.tool_calls),
                  model=resp.model, provider=resp.provider, model_ms=model_ms,
                  usage=usage_dict(resp.usage), trigger=inp.trigger)
        # thinking blocks ride along in memory only: the next round of this turn needs them
        c.messages.append(ChatMessage(role="assistant", content=resp.text,
                                      tool_calls=list(resp.tool_calls),
                                      thinking=list(resp.thinking)))
        if resp.text:
            result.text = resp.text
        result.notes += [n for n in resp.notes if n not in result.notes]
        if not resp.tool_calls and result.notes and not _silent(result.text):
            result.text = f"{result.text}\n\n({'; '.join(result.notes)}.)".strip()
        return resp

    async def _tool_round(self, inp: TurnInput, sink: LogSink, messages: list[ChatMessage],
                          ctx: ToolContext, tools: Resolution, loops: LoopDetector,
                          calls: list[ToolCall], pending: list[ToolCall],
                          result: TurnResult) -> bool:
        """The round's tool calls, one at a time, each result written as it comes. True:
        the tool-loop detector blocked the run (the remaining calls are not run)."""
        blocked = False
        for call in calls:
            if blocked:
                text, is_error = "error: not run — the run was stopped (tool loop)", True
            else:
                with telemetry.span("tool.call", {"tidegate.tool.name": call.name,
                                                  "tidegate.tool.call_id": call.id}) as sp:
                    text, is_error = await execute(self, inp, ctx, tools, call)
                    sp.set_attribute("tidegate.tool.is_error", is_error)
                    if is_error:
                        telemetry.fail("tool_error", sp)
                    telemetry.content(sp, {"tidegate.tool.arguments": call.arguments})
                seen = loops.observe(call.name, call.arguments, text)
                text += warning_note(call.name, seen) if seen.level == "warn" else ""
                blocked = seen.level == "block"
            mine = memory_owner(call.name, getattr(ctx.scope, "asker", None))
            sink.append_message(tool_result_message(call, text, is_error, self.now_ms(),
                                                    **mine))
            pending.remove(call)
            messages.append(ChatMessage(role="tool", content=text, tool_call_id=call.id,
                                        name=call.name, is_error=is_error,
                                        for_sender=mine.get("forSender")))
            result.tool_calls += 1
        return blocked

    def _recheck(self, inp: TurnInput, checked: list[float]) -> Any:
        """The ``before_send`` of a round's model call (replicas): the lane is asked again
        when its last check is more than :data:`LANE_RECHECK_S` old — the process was
        stopped or stalled after it (a slot wait, a retry's sleep, a SIGSTOP) and another
        replica may have taken the session meanwhile. None off replicas."""
        if inp.lane_held is None:
            return None

        async def before_send() -> None:
            if self.clock.monotonic() - checked[0] > LANE_RECHECK_S:
                await _lane_still_held(inp)
                checked[0] = self.clock.monotonic()
        return before_send

    async def _call_model(self, inp: TurnInput, sink: LogSink, request: ModelRequest,
                          attempts: AttemptBudget, budget: int, n_new: int,
                          control: TurnControl | None = None,
                          before_send: Any = None) -> tuple[Any, float]:
        """One model call; on ``context_overflow`` the session is compacted and the call
        retried once (seed 001 §2.5), the log line carrying a diagnostic id.
        ``before_send``: awaited before each attempt (:meth:`_recheck`)."""
        # Streaming costs CPU per chunk: deltas only when someone consumes them.
        extra = {"before_send": before_send} if before_send is not None else {}
        call = lambda: self.caller.call(
            request, model_override=inp.model, run_id=inp.run_id, budget=attempts,
            control=control, on_delta=(lambda d: self.emit(inp, "message_update", delta=d))
            if request.stream else None,
            on_error=lambda **d: self.emit(inp, "model_error", **d), **extra)
        try:
            return await call()
        except ModelCallError as exc:
            if exc.error_class != "context_overflow" or not isinstance(sink, SessionLog):
                raise
            diag = uuid.uuid4().hex[:8]
            log.warning("context_overflow", run_id=inp.run_id, session_key=inp.session_key,
                        diag_id=diag, tokens=sink.tokens, decision="compact_and_retry")
            if not await maybe_compact(self, inp, sink, n_new, budget, force=True):
                raise
            request.messages[:] = private_view(
                sink.context(budget, self.settings.history_turns),
                getattr(inp.tool_scope, "asker", None))
            return await call()

    async def compact_now(self, inp: TurnInput, sink: SessionLog) -> bool:
        """``/compact``: summarise the session's older context now, keeping the newest
        ``compaction.keep_ratio`` of it verbatim (same rules and records as
        auto-compaction). False when there is too little to compact or the summary call
        failed."""
        return await maybe_compact(self, inp, sink, 0, max(sink.tokens, 1), force=True)

