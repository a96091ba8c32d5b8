"""The one turn implementation: every trigger (user message, heartbeat, cron, system event)
runs through :meth:`AgentRunner.run` (seed 001 §1-§5; DESIGN.md step 6).

A turn builds the prompt (cached stable prefix + per-turn block), takes the session's
context tail within the model budget, calls the model with the policy-filtered tools,
executes tool calls one at a time (each under the tool timeout), feeds results back and
repeats until the model answers without tool calls — all under the turn timeout, with
tool-loop detection. Every message, tool call and result is written to the transcript
(through a ``LogSink``) and recorded to the timeline as it happens. Runtime events go to
the event bus.

- ``types``: :class:`UserText`, :class:`TurnInput`, :class:`TurnResult`
- ``runner``: :class:`AgentRunner` (the turn, its model rounds)
- ``tools``: one tool call executed; unfinished calls closed
- ``compact``: compaction inside a turn
"""

from runtime.context.budget import estimate_tokens
from runtime.turn.runner import AgentRunner
from runtime.turn.types import ABORTED, TurnInput, TurnResult, UserText

__all__ = ["ABORTED", "AgentRunner", "TurnInput", "TurnResult", "UserText", "estimate_tokens"]
