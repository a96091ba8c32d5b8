"""Tool calls inside a turn (seed 001 §3-§4): one call executed under the tool policy, the
tool-loop breaker and ``tool_timeout``; calls a stopped turn left unfinished closed with a
result, so the transcript never holds an unpaired call. ``r`` is the turn's
:class:`runtime.turn.runner.AgentRunner`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from runtime.context.messages import tool_result_message
from runtime.context.session_log import LogSink
from runtime.providers.base import ToolCall
from runtime.tools.policy import Resolution, refuse_call
from runtime.tools.registry import ToolContext, ToolRefused
from runtime.tools.taint import taint_of
from runtime.turn.deadline import paused as deadline_paused
from runtime.turn.types import TurnInput

log = structlog.get_logger(__name__)

Runner = Any  # runtime.turn.runner.AgentRunner (not imported: it imports this module)


async def execute(r: Runner, inp: TurnInput, ctx: ToolContext, tools: Resolution,
                  call: ToolCall) -> tuple[str, bool]:
    """Run one tool call (policy-refused, breaker-paused, bad JSON or the handler under
    ``tool_timeout``); TOOL_CALL/TOOL_RESULT recorded, start/end events emitted. Returns
    the result text and whether it is an error; never raises but CancelledError."""
    r.emit(inp, "tool_execution_start", tool=call.name, call_id=call.id,
               arguments=call.arguments)
    r.record(inp.session_id, "TOOL_CALL",
                 {"id": call.id, "name": call.name, "arguments": call.arguments})
    t0 = time.perf_counter()
    tool = tools.tools.get(call.name)
    is_error, known = True, len(ctx.taint)
    if tool is None:
        text = refuse_call(tools, call.name, session_key=inp.session_key,
                           run_id=inp.run_id)
    elif r.breaker is not None and (paused := r.breaker.paused(call.name)):
        text = (f"error: {call.name} is paused gateway-wide by the tool-loop breaker for "
                f"another {paused:.0f}s; do something else or answer the user.")
    elif "_error" in call.arguments:
        text = f"error: the tool arguments were not valid JSON: {call.arguments.get('_raw')}"
    elif ctx.gate is not None and (refusal := await _gated(ctx, call, inp)) is not None:
        text = refusal  # denied or timed out (a human's approval may have been awaited)
    else:
        try:
            # side-effecting tools are journaled now (gateway/journal/tracking.py), not at
            # tool_execution_start: a call that only waited for its approval did not run
            r.emit(inp, "tool_run_start", tool=call.name, call_id=call.id)
            if tool.side_effects and ctx.before_side_effect is not None:
                await ctx.before_side_effect(inp.run_id, call.name)  # marked, then run
            async with r.clock.timeout(r.settings.tool_timeout or None):
                text = await tool.handler(call.arguments, ctx)
            is_error = False
        except TimeoutError:
            text = f"error: tool timed out after {r.settings.tool_timeout:g}s"
        except asyncio.CancelledError:
            raise
        except ToolRefused as exc:  # e.g. a path outside the workspace
            text = f"error: {exc}"
            _log_refusal(inp, call, str(exc))
        except Exception as exc:  # noqa: BLE001 - errors go back to the model
            text = f"error: {exc}"
    # a configured secret in a file, a command's output or a fetched page: hidden before
    # the model, the transcript or the timeline see it
    text = ctx.secrets.scrub(text, where=f"tool:{call.name}", session_key=inp.session_key)
    if tool is not None and not is_error and (why := taint_of(tool, call.arguments)):
        ctx.taint.append(why)  # untrusted content reached the turn
    # what tainted it (here, or the tool itself: a file a stranger sent) is kept
    await keep_taint(r, inp, ctx, ctx.taint[known:])
    duration_ms = (time.perf_counter() - t0) * 1000
    r.record(inp.session_id, "TOOL_RESULT",
                 {"tool_call_id": call.id, "name": call.name, "result": text,
                  "is_error": is_error, "duration_ms": int(duration_ms)})
    r.emit(inp, "tool_execution_end", tool=call.name, call_id=call.id,
               is_error=is_error, duration_ms=duration_ms)
    return text, is_error


async def keep_taint(r: Runner, inp: TurnInput, ctx: ToolContext, new: list[str]) -> None:
    """Journal what newly tainted the turn (a tool result, or the system events it
    drained at its start: the ``turn_tainted`` event: the intake
    journal, gateway/journal/tracking.py; ``ctx.on_taint``: replicas' work row, awaited
    before the next call), so the turn re-run after a restart stays tainted."""
    for why in dict.fromkeys(new):
        r.emit(inp, "turn_tainted", why=why)
        if ctx.on_taint is not None:
            await ctx.on_taint(inp.run_id, why)


def close_pending(r: Runner, inp: TurnInput, sink: LogSink, pending: list[ToolCall],
                  text: str, aborted: bool = False) -> None:
    """Give every started-but-unfinished tool call a result, so the transcript never
    holds an unpaired call (``aborted`` marks them for journal resume)."""
    extra = {"aborted": True} if aborted else {}
    for call in list(pending):
        sink.append_message(tool_result_message(call, text, True, r.now_ms(), **extra))
        r.record(inp.session_id, "TOOL_RESULT",
                     {"tool_call_id": call.id, "name": call.name, "result": text,
                      "is_error": True, "duration_ms": 0, **extra})
    pending.clear()


def _log_refusal(inp: TurnInput, call: ToolCall, reason: str) -> None:
    """One record per refused tool call (issue 8: the trail of a model or a prompt
    injection probing the workspace)."""
    log.warning("tool_call_refused", session_key=inp.session_key, run_id=inp.run_id,
                tool=call.name, call_id=call.id, reason=reason)


async def _gated(ctx: Any, call: Any, inp: Any) -> str | None:
    """The approval gate, with the turn's deadline paused while a person decides."""
    with deadline_paused():
        return await ctx.gate(call.name, call.arguments, ctx, inp.session_id)
