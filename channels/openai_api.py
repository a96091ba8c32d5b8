"""OpenAI-compatible chat endpoint on the gateway (``POST /v1/chat/completions``,
``GET /v1/models``), behind the gateway token, as OpenClaw, nanobot and hermes-agent offer.

The last user message of the request runs one turn in the session named by the
``X-Session-Key`` header, else by the request's ``user`` field
(``agent:<agent>:openai:dm:<user>``); earlier messages in the request are ignored because
the session already holds the conversation. Content given as a list of parts has its text
parts joined with newlines (other part types are ignored).

Model mapping is deliberately lenient: ``model`` may name an agent (``tidegate/<id>`` or
``<id>``, case-insensitive), and any other name — clients and SDKs often send their own,
like ``gpt-4o`` — goes to the default agent instead of failing with 404. The response's
``model`` always says which agent answered (``tidegate/<id>``); ``GET /v1/models`` lists
the real choices.

``usage`` counts the whole turn (every model call of it, tool rounds included):
``prompt_tokens`` = input tokens (cached ones included, also shown as
``prompt_tokens_details.cached_tokens``), ``completion_tokens`` = output tokens. It is read
duck-typed from the turn result's ``usage`` (``input_tokens``/``output_tokens``/
``cache_read_tokens``, as ``runtime.providers.base.Usage``); zeros when the result has
none. ``stream: true`` answers with Server-Sent Events in the Chat Completions chunk
format; with ``stream_options: {"include_usage": true}`` every chunk carries ``"usage":
null`` and a last chunk before ``[DONE]`` has ``"choices": []`` and the usage, as OpenAI
does. Protocol reference: OpenAI API "Create chat completion" and "Chat completion chunk
object".
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from channels.outbound.silent import SilentStream, silent_reply
from runtime.ids import unique_hex
from runtime.lanes import LaneClosed

Authorize = Callable[[web.Request], bool]


def _last_user_text(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return None
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                # Parts are separate paragraphs to the client: keep them apart.
                return "\n".join(p["text"] for p in content if isinstance(p, dict)
                                 and p.get("type") == "text" and isinstance(p.get("text"), str))
    return None


def client_tools_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``tools`` (``[{"type": "function", "function": {"name",
    "description", "parameters"}}]``) as ``{"name", "description", "parameters"}``.
    Raises ValueError naming the bad entry."""
    import re
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ValueError("tools: must be a list of function tools")
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise ValueError(f"tools.{i}: a function tool with a name of 1-64 letters, "
                             "digits, '_' or '-' is required")
        params = fn.get("parameters")
        out.append({"name": name, "description": str(fn.get("description") or ""),
                    "parameters": params if isinstance(params, dict) else
                    {"type": "object", "properties": {}}})
    return out


def tool_results_of(messages: Any) -> list[dict[str, Any]]:
    """The ``role: tool`` messages that end the request (the caller's results for the
    tool calls of the previous response), ``[{"tool_call_id", "content"}]``."""
    out: list[dict[str, Any]] = []
    for msg in reversed(messages if isinstance(messages, list) else []):
        if not (isinstance(msg, dict) and msg.get("role") == "tool"):
            break
        out.append({"tool_call_id": str(msg.get("tool_call_id") or ""),
                    "content": msg.get("content")})
    return out[::-1]


def tool_calls_json(calls: list[Any]) -> list[dict[str, Any]]:
    """OpenAI ``tool_calls`` of a turn's client calls (ToolCall: id, name, arguments)."""
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments,
                                                                  ensure_ascii=False)}}
            for c in calls]


def usage_of(result: Any) -> dict[str, Any]:
    """OpenAI ``usage`` of a turn result that has ``usage.input_tokens``/``output_tokens``
    (duck-typed: the gateway's TurnResult), else zeros."""
    usage = getattr(result, "usage", None)

    def count(name: str) -> int:
        value = getattr(usage, name, 0)
        return value if isinstance(value, int) and value > 0 else 0

    prompt, completion = count("input_tokens"), count("output_tokens")
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": count("cache_read_tokens")}}


def _error(status: int, message: str, etype: str = "invalid_request_error",
           code: str | None = None, param: str | None = None,
           headers: dict[str, str] | None = None) -> web.Response:
    """An OpenAI error object: ``{"error": {"message", "type", "code", "param"}}``."""
    return web.json_response({"error": {"message": message, "type": etype, "code": code,
                                        "param": param}}, status=status, headers=headers)


# error class of a failed turn -> (HTTP status, error type, code)
_TURN_ERRORS = {
    "rate_limit": (429, "rate_limit_error", "rate_limit_exceeded"),
    "billing": (503, "server_error", "provider_quota_exhausted"),
    "auth": (503, "server_error", "provider_auth_failed"),
    "context_guard": (503, "server_error", "model_context_too_small"),
    "timeout": (504, "server_error", "provider_timeout"),
    "transient": (502, "server_error", "provider_error"),
    "attempts": (502, "server_error", "provider_error"),
    "invalid_request": (502, "server_error", "provider_refused_request"),
    "context_overflow": (400, "invalid_request_error", "context_length_exceeded"),
}


def shutting_down() -> web.Response:
    """The answer to a request the gateway cannot finish because it is stopping (its turn
    was cut off, or it could not be queued): another replica, or this one restarted,
    answers it when it is sent again."""
    return _error(503, "the gateway is shutting down; retry", "server_error",
                  "shutting_down", headers={"Retry-After": "1"})


async def settled(fut: asyncio.Future) -> web.Response | None:
    """Wait for the turn's future. None once it has a result; the error response when the
    turn cannot answer: cut off by a shutdown (the future cancelled: 503
    ``shutting_down``) or raised (500 ``internal_error``). A cancellation of the waiting
    handler itself (the client went away) still propagates."""
    await asyncio.wait({fut})  # unlike ``await fut``, the future's cancellation is not ours
    if fut.cancelled():
        return shutting_down()
    if fut.exception() is not None:
        return _error(500, "the turn failed on the gateway's side; the operator can find "
                      "it in the log", "server_error", "internal_error")
    return None


def turn_error(result: Any, text: str) -> web.Response | None:
    """The error response of a turn that did not answer (``result.status`` refused,
    error or timeout; duck-typed TurnResult), None for one that did. ``text`` (the user
    notice, never the provider's own words) is the message. A rate limit is 429 with
    ``Retry-After`` (seconds, 60 when unknown); a used-up budget 429
    ``insufficient_quota``; provider failures 502/503; timeouts 504; a bug 500."""
    status = str(getattr(result, "status", "ok"))
    if status == "refused":
        return _error(429, text, "insufficient_quota", "budget_exceeded")
    if status == "timeout":
        return _error(504, text, "server_error", "turn_timeout")
    if status != "error":
        return None
    cls = getattr(result, "error_class", None)
    code, etype, name = _TURN_ERRORS.get(cls, (500, "server_error", "internal_error"))
    headers = None
    if code == 429:
        wait = getattr(result, "retry_after", None) or 60
        headers = {"Retry-After": str(max(1, math.ceil(wait)))}
    return _error(code, text, etype, name, "messages" if code == 400 else None, headers)


@web.middleware
async def json_errors(request: web.Request, handler: Callable) -> web.StreamResponse:
    """Under ``/v1/`` an unknown path (404), a wrong method (405) and a body over the
    size limit (413) answer OpenAI error objects, not aiohttp's text pages."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if not request.path.startswith("/v1/") or exc.status < 400:
            raise
        names = {404: ("not_found_error", "unknown_url"),
                 405: ("invalid_request_error", "method_not_allowed"),
                 413: ("invalid_request_error", "request_too_large")}
        etype, code = names.get(exc.status, ("invalid_request_error", None))
        message = {404: f"unknown path {request.path}",
                   405: f"{request.method} is not allowed on {request.path}"}.get(
            exc.status, exc.reason)
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return _error(exc.status, message, etype, code, headers=headers)


def openai_routes(*, authorize: Authorize, agents: Callable[[], list[str]],
                  default_agent: Callable[[], str], submit: Callable[..., Any],
                  subscribe: Callable[[str, Callable], Callable[[], None]],
                  result_text: Callable[[Any], tuple[str, str]]) -> list[web.RouteDef]:
    """Build the routes. ``submit(text, agent_id=, session_key=, to=, channel=)`` returns an
    object with ``future``, ``session_key``, ``run_id``; ``subscribe(run_id, fn)`` streams
    runtime events of that run; ``result_text(result) -> (text, status)``."""
    api = OpenAIChat(authorize, agents, default_agent, submit, subscribe, result_text)
    return [web.get("/v1/models", api.models), web.post("/v1/chat/completions", api.completions)]


def openai_middlewares() -> list[Any]:
    """The middlewares the app serving these routes needs (JSON error objects)."""
    return [json_errors]


class OpenAIChat:
    """The handlers of :func:`openai_routes` (its arguments are the callables here)."""

    def __init__(self, authorize: Authorize, agents: Callable[[], list[str]],
                 default_agent: Callable[[], str], submit: Callable[..., Any],
                 subscribe: Callable[[str, Callable], Callable[[], None]],
                 result_text: Callable[[Any], tuple[str, str]]) -> None:
        self.authorize, self.agents, self.default_agent = authorize, agents, default_agent
        self.submit, self.subscribe, self.result_text = submit, subscribe, result_text

    def pick_agent(self, model: Any) -> str:
        """The agent ``model`` names (``tidegate/<id>`` or ``<id>``), else the default."""
        ids = self.agents()
        if isinstance(model, str):
            name = model.split("/", 1)[1] if model.startswith("tidegate/") else model
            if name.lower() in ids:
                return name.lower()
        return self.default_agent()

    async def models(self, request: web.Request) -> web.Response:
        """The agents as models, ``tidegate/<agent>``."""
        if not self.authorize(request):
            return _error(401, "invalid or missing bearer token", "authentication_error")
        now = int(time.time())
        return web.json_response({"object": "list", "data": [
            {"id": f"tidegate/{a}", "object": "model", "created": now, "owned_by": "tidegate"}
            for a in self.agents()]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """Run one turn from the last user message (session from ``X-Session-Key``, else the
        request's ``user``); ``stream: true`` answers with SSE chunks."""
        if not self.authorize(request):
            return _error(401, "invalid or missing bearer token", "authentication_error")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body must be JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        if not isinstance(body.get("model"), str) or not body["model"].strip():
            code = "missing_required_parameter" if "model" not in body else "invalid_type"
            return _error(400, "you must provide a model parameter", code=code,
                          param="model")
        results = tool_results_of(body.get("messages"))
        text = "" if results else _last_user_text(body.get("messages"))
        if not text and not results:
            return _error(400, "messages must contain a user message with text",
                          param="messages")
        try:
            tools = client_tools_of(body)
        except ValueError as exc:
            return _error(400, str(exc), param="tools")
        agent = self.pick_agent(body.get("model"))
        key = request.headers.get("X-Session-Key")
        user = str(body.get("user") or "default")
        try:
            extra = {"client_tools": tools, "tool_results": results} if tools or results \
                else {}
            sub = self.submit(text, agent_id=None if key else agent, session_key=key,
                              to=None if key else user, channel="openai",
                              stream=body.get("stream") is True, **extra)
        except ValueError as exc:
            return _error(400, str(exc))
        except LaneClosed:  # stopping: another replica (or this one, restarted) answers
            return shutting_down()
        model_name = f"tidegate/{sub.agent_id}"
        cid = "chatcmpl-" + unique_hex(24)
        created = int(time.time())
        if not body.get("stream"):
            return await self._completion(sub, cid, created, model_name)
        options = body.get("stream_options")
        with_usage = isinstance(options, dict) and options.get("include_usage") is True
        return await _stream(request, sub, cid, created, model_name, self.subscribe,
                             self.result_text, with_usage)

    async def _completion(self, sub: Any, cid: str, created: int,
                          model_name: str) -> web.Response:
        """The whole turn as one ``chat.completion`` object."""
        cut = await settled(sub.future)
        if cut is not None:  # answered before the server closes (docs/openai-api.md)
            cut.headers["X-Session-Key"] = sub.session_key
            return cut
        result = sub.future.result()
        reply, _status = self.result_text(result)
        failed = turn_error(result, reply)
        if failed is not None:  # an error is never dressed up as an answer
            failed.headers["X-Session-Key"] = _shown(sub)
            return failed
        reply = silent_reply(reply).text  # a silent reply is "" (README "Silent replies")
        message: dict[str, Any] = {"role": "assistant", "content": reply}
        calls = getattr(result, "client_calls", None) or []
        if calls:  # the client runs them; its next request carries the results
            message = {"role": "assistant", "content": reply or None,
                       "tool_calls": tool_calls_json(calls)}
        return web.json_response({
            "id": cid, "object": "chat.completion", "created": created,
            "model": model_name,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": usage_of(result),
        }, headers={"X-Session-Key": _shown(sub)})


def _shown(sub: Any) -> str:
    """The session key for the ``X-Session-Key`` header, as people write it (the
    submitter's ``shown_key`` when it has one)."""
    return getattr(sub, "shown_key", None) or sub.session_key


def _texts(ev: Any, shown: SilentStream, last: str) -> list[str]:
    """The content deltas one runtime event adds (``last``: the content sent before it)."""
    if ev.type == "message_update":
        return [t for t in [shown.push(ev.data.get("delta", ""))] if t]
    if ev.type == "agent_start":  # a second one: the turn re-run elsewhere (a takeover)
        shown.attempt()
        return []
    if ev.type == "message_end" and ev.data.get("tool_calls"):
        rest = shown.round_end()
        out = [rest] if rest else []
        if (rest or last) and not (rest or last).endswith("\n"):
            out.append("\n\n")  # text before tool calls was a step: set the answer apart
        return out
    return []


async def _stream(request: web.Request, sub: Any, cid: str, created: int, model: str,
                  subscribe: Callable, result_text: Callable,
                  with_usage: bool = False) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache",
                                       "X-Session-Key": _shown(sub)})
    shown = SilentStream()  # nothing of a silent reply reaches the client
    sent: list[str] = []

    def chunk(delta: dict[str, Any] | None, finish: str | None = None,
              usage: dict[str, Any] | None = None) -> bytes:
        obj: dict[str, Any] = {
            "id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [] if delta is None else [
                {"index": 0, "delta": delta, "finish_reason": finish}]}
        if with_usage:
            obj["usage"] = usage
        return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"

    queue: list[bytes] = []
    waiter: dict[str, Any] = {}

    def on_event(ev: Any) -> None:
        for text in _texts(ev, shown, sent[-1] if sent else ""):
            sent.append(text)
            queue.append(chunk({"content": text}))
        w = waiter.get("ev")
        if w is not None and not w.done():
            w.set_result(None)

    unsubscribe = subscribe(sub.run_id, on_event)  # before any await: no delta is missed
    try:
        await resp.prepare(request)
        await resp.write(chunk({"role": "assistant", "content": ""}))
        while not sub.future.done() or queue:
            while queue:
                await resp.write(queue.pop(0))
            if sub.future.done():
                break
            waiter["ev"] = asyncio.get_running_loop().create_future()
            await asyncio.wait({waiter["ev"], sub.future}, return_when=asyncio.FIRST_COMPLETED)
        while queue:
            await resp.write(queue.pop(0))
        cut = await settled(sub.future)
        if cut is not None:  # mid-stream: the error event, as for a failed turn
            await resp.write(b"data: " + cut.body + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        result = sub.future.result()
        reply, _ = result_text(result)
        failed = turn_error(result, reply)
        if failed is not None:  # mid-stream, as OpenAI does: an error event, no "stop"
            await resp.write(b"data: " + failed.body + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        # the rest held back, or all of it when nothing streamed (a command reply, say)
        if rest := shown.end(reply):
            await resp.write(chunk({"content": rest}))
        calls = getattr(result, "client_calls", None) or []
        if calls:
            await resp.write(chunk({"tool_calls": [{"index": i, **c} for i, c in
                                                   enumerate(tool_calls_json(calls))]}))
        await resp.write(chunk({}, "tool_calls" if calls else "stop"))
        if with_usage:
            await resp.write(chunk(None, usage=usage_of(result)))
        await resp.write(b"data: [DONE]\n\n")
    finally:
        unsubscribe()
    return resp

