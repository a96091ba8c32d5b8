"""Client tools: tools a caller of the OpenAI-compatible API offers with its request
(``tools``), run by that caller, the OpenAI way (docs/openai-api.md "Client tools").

They are offered to the model beside the agent's own tools (an agent tool of the same
name wins: the client's is left out). When the model calls one, the agent's own calls of
that round run as usual and the turn ends there: ``TurnResult.client_calls`` holds the
calls for the caller. The next turn of the session carries the caller's results
(``TurnInput.tool_results``); they are written as the calls' results and the model
continues. A next turn without a result for a waiting call completes it with an error
result, so the transcript never holds a call without its result.
"""

from __future__ import annotations

from typing import Any

from runtime.context.messages import tool_result_message
from runtime.providers.base import ChatMessage, ToolCall, ToolSpec

NO_RESULT = "error: the client returned no result for this call"
_WAITING: dict[str, list[ToolCall]] = {}  # session id -> client calls awaiting results
_WAITING_MAX = 10_000  # sessions whose caller never came back are forgotten, oldest first


def wait_for(session_id: str, calls: list[ToolCall]) -> None:
    """The session's turn ended with ``calls`` for the client (kept across agent rebuilds;
    a restart leaves them to the transcript's repair at load)."""
    _WAITING.pop(session_id, None)
    _WAITING[session_id] = list(calls)
    while len(_WAITING) > _WAITING_MAX:
        del _WAITING[next(iter(_WAITING))]


def take_waiting(session_id: str) -> list[ToolCall]:
    return _WAITING.pop(session_id, [])


def offered(specs: list[ToolSpec], client: list[ToolSpec]) -> tuple[list[ToolSpec], set[str]]:
    """The specs for the model and the names that are the client's."""
    own = {s.name for s in specs}
    extra = [s for s in client if s.name not in own]
    return [*specs, *extra], {s.name for s in extra}


def split(calls: list[ToolCall], client_names: set[str]) -> tuple[list[ToolCall],
                                                                   list[ToolCall]]:
    """(the agent's calls, the client's calls) of one model round."""
    return ([c for c in calls if c.name not in client_names],
            [c for c in calls if c.name in client_names])


def answer_waiting(runner: Any, inp: Any, sink: Any, waiting: list[ToolCall],
                   new: list[ChatMessage]) -> int:
    """Write the results of the client calls the last turn ended with: the caller's
    (``inp.tool_results``: ``[{"tool_call_id", "content"}]``), else an error result.
    Appends the tool messages to ``new``; returns how many results the caller gave."""
    given = {str(r.get("tool_call_id")): r for r in inp.tool_results or ()}
    used = 0
    for call in waiting:
        r = given.get(call.id)
        text, is_error = (_text(r.get("content")), False) if r else (NO_RESULT, True)
        used += r is not None
        sink.append_message(tool_result_message(call, text, is_error, runner.now_ms(),
                                                client=True))
        runner.record(inp.session_id, "TOOL_RESULT", {
            "tool_call_id": call.id, "name": call.name, "result": text,
            "is_error": is_error, "client": True})
        new.append(ChatMessage(role="tool", content=text, tool_call_id=call.id,
                               name=call.name, is_error=is_error))
    return used


def _text(content: Any) -> str:
    """A tool message's content: a string, or OpenAI content parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)
