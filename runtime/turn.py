"""The one turn implementation: every trigger (user message, heartbeat, cron, system event)
runs through :meth:`AgentRunner.run` (seed 001 §1-§5; DESIGN.md step 6).

A turn builds the prompt (cached stable prefix + per-turn block), takes the session's
context tail within the model budget, calls the model with the policy-filtered tools,
executes tool calls one at a time (each under the tool timeout), feeds results back and
repeats until the model answers without tool calls — all under the turn timeout, with
tool-loop detection. Every message, tool call and result is written to the transcript
(through a ``LogSink``) and recorded to the timeline as it happens. Runtime events go to
the event bus.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.compaction import SUMMARY_SHARE, plan_compaction, summary_request
from runtime.context import (
    CHARS_PER_TOKEN,
    HeldLog,
    LogSink,
    SessionLog,
    assistant_message,
    estimate_tokens,
    fit_to_budget,
    tool_result_message,
    user_message,
)
from runtime.context_guard import ContextWindowGuard
from runtime.durability import TurnBatch
from runtime.events import EventBus, RuntimeEvent
from runtime.lanes import TurnControl
from runtime.media.ref import MediaRef
from runtime.neutralize import neutralize_user_text
from runtime.prompt import PromptBuilder
from runtime.providers.base import ChatMessage, ModelRequest, ToolCall, Usage
from runtime.providers.failover.chain import AttemptBudget, ModelCaller, ModelCallError
from runtime.providers.failover.errors import user_notice
from runtime.tool_loop import BLOCK_NOTICE, LoopBreaker, LoopDetector, warning_note
from runtime.tools.policy import Resolution, refuse_call
from runtime.tools.registry import ToolContext, ToolRefused

log = structlog.get_logger(__name__)

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
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
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
    reasoning: str | None = None  # /think level: low | medium | high (None: off)


class _Refused(Exception):
    """The gate refused the next model call (a budget is used up)."""


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
    model: str = ""
    provider: str = ""
    profile: str = ""
    usage: Usage = field(default_factory=Usage)
    tool_calls: int = 0
    rounds: int = 0
    duration_ms: float = 0.0
    model_ms: float = 0.0


class AgentRunner:
    """Runs turns for one agent. Long-lived: holds the prompt builder and tool list."""

    def __init__(self, *, agent_id: str, settings: Any, prompt: PromptBuilder,
                 tools: Callable[[TurnInput], Resolution], caller: ModelCaller, bus: EventBus,
                 tool_context: Callable[[str], ToolContext], clock: Clock = SYSTEM_CLOCK,
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
    def _emit(self, inp: TurnInput, etype: str, **data: Any) -> None:
        self.bus.emit(RuntimeEvent(etype, inp.run_id, inp.session_key, self.agent_id,
                                   self.clock.time(), data))

    def _record(self, session_id: str, etype: str, content: dict[str, Any]) -> None:
        if self.recorder is not None:
            self.recorder(session_id, etype, content)

    def _now_ms(self) -> int:
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
        self._emit(inp, "agent_start", trigger=inp.trigger)
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
            async with self.clock.timeout(timeout or None):
                await self._loop(inp, sink, history, control, result, pending, batch)
        except _Refused as stop:
            self._refuse(inp, result, str(stop))
        except TimeoutError:
            self._close_pending(inp, sink, pending, "error: the turn timed out")
            result.status = "timeout"
            result.error = f"turn timed out after {timeout:g}s"
            result.text = result.text or f"(The turn timed out after {timeout:g}s.)"
        except asyncio.CancelledError:
            reason = getattr(control, "abort_reason", None) or "cancelled"
            self._record(inp.session_id, "SYSTEM_EVENT", {
                "kind": "turn_aborted", "run_id": inp.run_id, "reason": reason,
                "tool_calls_aborted": [c.id for c in pending]})
            self._close_pending(inp, sink, pending, ABORTED, aborted=True)
            result.status = "aborted"
            self._finish(inp, result, t0)
            raise
        except ModelCallError as exc:  # expected upstream trouble: logged without traceback
            self._close_pending(inp, sink, pending, "error: the model call failed")
            log.warning("turn_failed", run_id=inp.run_id, session_key=inp.session_key,
                        error_class=exc.error_class, error=str(exc)[:1000])
            result.status, result.error = "error", str(exc)
            result.text = exc.notice
        except Exception as exc:
            self._close_pending(inp, sink, pending, f"error: {exc}")
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
        self._emit(inp, "agent_end", status=result.status, text=result.text, error=result.error,
                   duration_ms=result.duration_ms, model_ms=result.model_ms,
                   usage=_usage_dict(result.usage), trigger=inp.trigger)

    def _append_user(self, inp: TurnInput, sink: LogSink, msgs: list[ChatMessage],
                     u: UserText, max_chars: int | None = None) -> None:
        text = neutralize_user_text(u.text)
        extra = {k: v for k, v in (("sender", u.sender), ("messageId", u.message_id)) if v}
        if max_chars is not None and len(text) > max_chars:
            # A message larger than the model's context would otherwise drop out of the
            # context window entirely: keep its beginning and say so.
            log.warning("user_message_truncated", session_key=inp.session_key,
                        chars=len(text), kept=max_chars)
            extra["truncatedFrom"] = len(text)
            text = (text[:max_chars] + f"\n\n[... message truncated: {len(text) - max_chars} "
                    f"more characters did not fit the model's context ...]")
        ts = int((u.received_at or self.clock.time()) * 1000)
        sink.append_message(user_message(text, ts, u.media, **extra))
        self._record(inp.session_id, "USER_INPUT",
                     {"text": text, **({"sender": u.sender} if u.sender else {}),
                      **({"message_id": u.message_id} if u.message_id else {}),
                      **({"media": [r.to_dict() for r in u.media]} if u.media else {})})
        msgs.append(ChatMessage(role="user", content=text, media=list(u.media)))

    async def _loop(self, inp: TurnInput, sink: LogSink, history: list[ChatMessage] | None,
                    control: TurnControl | None, result: TurnResult,
                    pending: list[ToolCall], batch: TurnBatch) -> None:
        system = self.prompt.stable_prefix()
        dynamic = PromptBuilder.dynamic_block(
            now=self.clock.time(), tz=self.settings.user_timezone,
            session_started_at=inp.session_started_at, last_user_at=inp.last_user_at,
            environment=inp.environment, system_events=inp.system_events,
            guidance=inp.guidance)
        verdict = self.guard.verdict(inp.model or self.caller.chain[0]) if self.guard else None
        window = min(self.settings.context_tokens, verdict.window if verdict else 1 << 30)
        budget = max(window - self.settings.max_tokens
                     - (len(system) + len(dynamic)) // 4 - 256, 512)
        new: list[ChatMessage] = []
        share = max(1, len(inp.messages) + (1 if inp.prompt else 0))
        max_chars = budget * CHARS_PER_TOKEN // (2 * share)  # new messages: half the budget
        for u in inp.messages:
            if not u.logged:
                self._append_user(inp, sink, new, u, max_chars)
        if inp.prompt:
            sink.append_message(user_message(inp.prompt, self._now_ms(), trigger=inp.trigger))
            self._record(inp.session_id, "USER_INPUT", {"text": inp.prompt,
                                                       "trigger": inp.trigger})
            new.append(ChatMessage(role="user", content=inp.prompt))
        batch.flush_input()
        if verdict is not None and verdict.level == "refuse":
            log.error("context_guard_refused", run_id=inp.run_id, session_key=inp.session_key,
                      model=verdict.ref, window=verdict.window, error=verdict.message)
            result.status, result.error = "error", verdict.message
            result.text = user_notice("context_guard")
            return
        if isinstance(sink, SessionLog):
            if self.settings.compaction.enabled:
                await self._maybe_compact(inp, sink, len(new), budget)
            # this turn's messages are the newest entries
            messages = sink.context(budget, self.settings.history_turns)
        elif isinstance(sink, HeldLog):
            reserve = sum(estimate_tokens(m) for m in new)
            turns = self.settings.history_turns
            messages = sink.target.context(budget - reserve, max(1, turns - len(new))
                                           if turns else 0) + new
        else:
            messages = fit_to_budget((history or []) + new, budget)
        ctx = self.tool_context(inp.session_key)
        tools = self.resolve_tools(inp)
        ctx.scope = inp.tool_scope if inp.tool_scope is not None else tools.scope
        loops = LoopDetector(self.settings.tool_loop, self.breaker, inp.session_key)
        attempts = self.caller.budget(self.settings.timeout if inp.timeout is None
                                      else inp.timeout)
        for round_no in range(1, self.settings.max_tool_rounds + 1):
            result.rounds = round_no
            if control is not None and round_no > 1 and inp.steer_text is not None:
                steered = control.take_steer()
                for payload in steered:
                    self._append_user(inp, sink, messages, inp.steer_text(payload))
                if steered:
                    batch.flush_input()
            # Streaming costs CPU per chunk: only when someone consumes the deltas.
            stream = inp.stream or self.bus.wants_deltas(inp.run_id)
            request = ModelRequest(
                model="", system=system, system_dynamic=dynamic, messages=messages,
                tools=tools.specs, max_tokens=self.settings.max_tokens,
                temperature=self.settings.temperature, stream=stream,
                reasoning=inp.reasoning)
            if round_no > 1 and (refused := self._refusal(inp)) is not None:
                raise _Refused(refused)
            self._emit(inp, "message_start", round=round_no)
            resp, model_ms = await self._call_model(inp, sink, request, attempts, budget,
                                                    len(new), control)
            result.model_ms += model_ms
            result.model, result.provider = resp.model, resp.provider
            result.profile = resp.auth_profile
            _add_usage(result.usage, resp.usage)
            sink.append_message(assistant_message(
                resp.text, resp.tool_calls, self._now_ms(), api=resp.api,
                provider=resp.provider, model=resp.model, usage=_usage_dict(resp.usage),
                stopReason="toolUse" if resp.tool_calls else resp.stop_reason))
            self._record(inp.session_id, "LLM_RESPONSE", {
                "text": resp.text, "model": resp.model, "provider": resp.provider,
                "profile": resp.auth_profile,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                               for c in resp.tool_calls],
                "usage": _usage_dict(resp.usage), "stop_reason": resp.stop_reason,
                "model_ms": round(model_ms, 2)})
            self._emit(inp, "message_end", text=resp.text, tool_calls=len(resp.tool_calls),
                       model=resp.model, provider=resp.provider, model_ms=model_ms,
                       usage=_usage_dict(resp.usage), trigger=inp.trigger)
            assistant = ChatMessage(role="assistant", content=resp.text,
                                    tool_calls=list(resp.tool_calls))
            messages.append(assistant)
            if resp.text:
                result.text = resp.text
            if not resp.tool_calls:
                return
            pending[:] = list(resp.tool_calls)
            blocked = False
            batch.flush()  # the calls are on disk before their side effects
            for call in resp.tool_calls:
                if blocked:
                    text, is_error = "error: not run — the run was stopped (tool loop)", True
                else:
                    text, is_error = await self._execute(inp, ctx, tools, call)
                    seen = loops.observe(call.name, call.arguments, text)
                    text += warning_note(call.name, seen) if seen.level == "warn" else ""
                    blocked = seen.level == "block"
                sink.append_message(tool_result_message(call, text, is_error, self._now_ms()))
                pending.remove(call)
                messages.append(ChatMessage(role="tool", content=text, tool_call_id=call.id,
                                            name=call.name, is_error=is_error))
                result.tool_calls += 1
            if blocked:
                result.status, result.error = "error", "tool loop detected"
                result.text = BLOCK_NOTICE
                return
        note = f"(Stopped after {self.settings.max_tool_rounds} tool rounds.)"
        result.text = f"{result.text}\n\n{note}".strip()
        result.status = "error"
        result.error = "tool round limit reached"

    async def _call_model(self, inp: TurnInput, sink: LogSink, request: ModelRequest,
                          attempts: AttemptBudget, budget: int, n_new: int,
                          control: TurnControl | None = None) -> tuple[Any, float]:
        """One model call; on ``context_overflow`` the session is compacted and the call
        retried once (seed 001 §2.5), the log line carrying a diagnostic id."""
        # Streaming costs CPU per chunk: deltas only when someone consumes them.
        call = lambda: self.caller.call(
            request, model_override=inp.model, run_id=inp.run_id, budget=attempts,
            control=control, on_delta=(lambda d: self._emit(inp, "message_update", delta=d))
            if request.stream else None,
            on_error=lambda **d: self._emit(inp, "model_error", **d))
        try:
            return await call()
        except ModelCallError as exc:
            if exc.error_class != "context_overflow" or not isinstance(sink, SessionLog):
                raise
            diag = uuid.uuid4().hex[:8]
            log.warning("context_overflow", run_id=inp.run_id, session_key=inp.session_key,
                        diag_id=diag, tokens=sink.tokens, decision="compact_and_retry")
            if not await self._maybe_compact(inp, sink, n_new, budget, force=True):
                raise
            request.messages[:] = sink.context(budget, self.settings.history_turns)
            return await call()

    async def _execute(self, inp: TurnInput, ctx: ToolContext, tools: Resolution,
                       call: ToolCall) -> tuple[str, bool]:
        self._emit(inp, "tool_execution_start", tool=call.name, call_id=call.id,
                   arguments=call.arguments)
        self._record(inp.session_id, "TOOL_CALL",
                     {"id": call.id, "name": call.name, "arguments": call.arguments})
        t0 = time.perf_counter()
        tool = tools.tools.get(call.name)
        is_error = True
        if tool is None:
            text = refuse_call(tools, call.name, session_key=inp.session_key,
                               run_id=inp.run_id)
        elif self.breaker is not None and (paused := self.breaker.paused(call.name)):
            text = (f"error: {call.name} is paused gateway-wide by the tool-loop breaker for "
                    f"another {paused:.0f}s; do something else or answer the user.")
        elif "_error" in call.arguments:
            text = f"error: the tool arguments were not valid JSON: {call.arguments.get('_raw')}"
        else:
            try:
                async with self.clock.timeout(self.settings.tool_timeout or None):
                    text = await tool.handler(call.arguments, ctx)
                is_error = False
            except TimeoutError:
                text = f"error: tool timed out after {self.settings.tool_timeout:g}s"
            except asyncio.CancelledError:
                raise
            except ToolRefused as exc:  # e.g. a path outside the workspace
                text = f"error: {exc}"
                _log_refusal(inp, call, str(exc))
            except Exception as exc:  # noqa: BLE001 - errors go back to the model
                text = f"error: {exc}"
        duration_ms = (time.perf_counter() - t0) * 1000
        self._record(inp.session_id, "TOOL_RESULT",
                     {"tool_call_id": call.id, "name": call.name, "result": text,
                      "is_error": is_error, "duration_ms": int(duration_ms)})
        self._emit(inp, "tool_execution_end", tool=call.name, call_id=call.id,
                   is_error=is_error, duration_ms=duration_ms)
        return text, is_error

    async def compact_now(self, inp: TurnInput, sink: SessionLog) -> bool:
        """``/compact``: summarise the session's older context now, keeping the newest
        ``compaction.keep_ratio`` of it verbatim (same rules and records as
        auto-compaction). False when there is too little to compact or the summary call
        failed."""
        return await self._maybe_compact(inp, sink, 0, max(sink.tokens, 1), force=True)

    async def _maybe_compact(self, inp: TurnInput, sink: SessionLog, n_new: int,
                             budget: int, force: bool = False) -> bool:
        """Summarise older context when it nears the budget (runtime/compaction.py), or
        (``force``: the provider said the context overflowed) now. True when compacted.

        This turn's ``n_new`` messages were already appended to ``sink`` (the newest cached
        entries) and are always kept."""
        cfg = self.settings.compaction
        threshold = 1e-9 if force else cfg.threshold
        if sink.tokens <= budget * threshold:  # O(1): the common case
            return False
        cached = sink.messages()
        plan = plan_compaction(cached, budget, threshold=threshold,
                               keep_ratio=cfg.keep_ratio)
        if plan is None or plan.keep_from > len(cached) - n_new:
            return False
        self._emit(inp, "auto_compaction_start", tokens_before=plan.tokens_before,
                   messages=plan.keep_from)
        try:
            resp, _ = await self.caller.call(summary_request(cached[:plan.keep_from]),
                                             model_override=inp.model)
            # Capped so the compacted context always ends well below the threshold.
            summary = resp.text.strip()[:int(budget * SUMMARY_SHARE) * CHARS_PER_TOKEN]
            if not summary:
                raise ValueError("empty summary")
        except Exception as exc:  # noqa: BLE001 - fall back to truncation
            log.warning("compaction_failed", session_key=inp.session_key, error=str(exc))
            self._emit(inp, "auto_compaction_end", ok=False, error=str(exc))
            return False
        entry = sink.apply_compaction(summary, plan.keep_from, plan.tokens_before)
        self._record(inp.session_id, "COMPACTION", {
            "summary": summary, "first_kept_entry_id": entry["firstKeptEntryId"],
            "tokens_before": plan.tokens_before, "tokens_after": sink.tokens,
            "messages_summarised": plan.keep_from})
        log.info("compacted", session_key=inp.session_key, tokens_before=plan.tokens_before,
                 tokens_after=sink.tokens, messages_summarised=plan.keep_from)
        self._emit(inp, "auto_compaction_end", ok=True, tokens_after=sink.tokens)
        return True

    def _close_pending(self, inp: TurnInput, sink: LogSink, pending: list[ToolCall],
                       text: str, aborted: bool = False) -> None:
        """Give every started-but-unfinished tool call a result, so the transcript never
        holds an unpaired call (``aborted`` marks them for journal resume)."""
        extra = {"aborted": True} if aborted else {}
        for call in list(pending):
            sink.append_message(tool_result_message(call, text, True, self._now_ms(), **extra))
            self._record(inp.session_id, "TOOL_RESULT",
                         {"tool_call_id": call.id, "name": call.name, "result": text,
                          "is_error": True, "duration_ms": 0, **extra})
        pending.clear()


def _log_refusal(inp: TurnInput, call: ToolCall, reason: str) -> None:
    """One record per refused tool call (issue 8: the trail of a model or a prompt
    injection probing the workspace)."""
    log.warning("tool_call_refused", session_key=inp.session_key, run_id=inp.run_id,
                tool=call.name, call_id=call.id, reason=reason)


def _usage_dict(u: Usage) -> dict[str, int]:
    return {"input": u.input_tokens, "output": u.output_tokens,
            "cacheRead": u.cache_read_tokens, "cacheWrite": u.cache_write_tokens,
            "totalTokens": u.total_tokens}


def _add_usage(total: Usage, u: Usage) -> None:
    total.input_tokens += u.input_tokens
    total.output_tokens += u.output_tokens
    total.cache_read_tokens += u.cache_read_tokens
    total.cache_write_tokens += u.cache_write_tokens


__all__ = ["AgentRunner", "TurnInput", "TurnResult", "UserText", "estimate_tokens"]
