"""A fake OpenAI Chat Completions server (``POST /v1/chat/completions``, ``GET /v1/models``).

Speaks the real HTTP protocol closely enough for the official ``openai`` SDK: JSON
responses, and for ``stream: true`` SSE ``data: {chunk}\\n\\n`` lines ending with
``data: [DONE]`` — a role chunk, content chunks one word each, tool-call deltas split over
several chunks (id/name first, then argument fragments) the way OpenAI sends them, a
finish chunk, and a usage chunk with ``choices: []`` when ``stream_options.include_usage``.

It validates what the real API rejects (missing model/messages, a ``tool`` message that
does not answer the preceding assistant ``tool_calls``, unanswered tool calls, non-string
arguments, ``stream_options`` without ``stream``) with a 400, so serialisation bugs fail
tests. Repeated system prompts report ``prompt_tokens_details.cached_tokens`` like OpenAI's
automatic prompt caching. ``api_key=`` makes it answer 401 to any other bearer token.

Usage: ``async with FakeOpenAI() as fake: AsyncOpenAI(base_url=fake.base_url, ...)``
(``base_url`` is ``http://127.0.0.1:PORT/v1``); scripting, threads, standalone process
(``python -m tests.fakes.fake_openai --port 0``) and control endpoints are described in
``tests/fakes/__init__.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

from aiohttp import web

from . import ScriptedModelServer, approx_tokens, split_every, split_words

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
}


class FakeOpenAI(ScriptedModelServer):
    """Scriptable fake of the OpenAI Chat Completions API (see module docstring)."""

    api_root = "/v1"

    def __init__(self, *, api_key: str | set[str] | None = None, model: str = "fake-model",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.api_key = api_key
        self.model = model
        self._ids = itertools.count(1)
        self._seen_prefixes: set[str] = set()
        self.first_piece_at: float | None = None  # monotonic time the first text piece went out
        self.transcript = "this is what the voice note said"
        self.transcriptions: list[dict[str, Any]] = []  # model, filename, size, auth
        self.no_reasoning_models: set[str] = set()  # models that 400 on reasoning_effort

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/audio/transcriptions", self._transcribe)

    def last_user_text(self, body: dict[str, Any]) -> str:
        for msg in reversed(body.get("messages") or []):
            if msg.get("role") == "user":
                content = msg.get("content")
                if isinstance(content, list):
                    return "".join(p.get("text", "") for p in content if isinstance(p, dict))
                return str(content or "")
        return ""

    # -- handlers ------------------------------------------------------------------------

    async def _transcribe(self, request: web.Request) -> web.Response:
        """``POST /v1/audio/transcriptions`` (multipart: file, model[, language]) ->
        ``{"text": self.transcript}``, as OpenAI, Groq and whisper servers answer."""
        form = await request.post()
        upload = form.get("file")
        if not isinstance(upload, web.FileField) or not form.get("model"):
            return self._error(400, "file and model are required")
        data = upload.file.read()
        self.transcriptions.append({"model": form.get("model"), "filename": upload.filename,
                                    "size": len(data),
                                    "auth": request.headers.get("Authorization", "")})
        return web.json_response({"text": self.transcript})

    async def _models(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "tidegate-tests"}
        ]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self.record(request)
        presented = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not self.key_ok(presented):
            return self._error(401, f"Incorrect API key provided: {presented}.", presented)
        if not isinstance(body, dict):
            return self._error(400, "We could not parse the JSON body of your request.")
        problem = validate_chat_request(body)
        if problem:
            return self._error(400, problem)
        if "reasoning_effort" in body and body.get("model") in self.no_reasoning_models:
            return self._error(400, "Unsupported parameter: 'reasoning_effort' is not "
                               "supported with this model.")  # as gpt-4o answers
        item = self.next_item(body)
        delay = item.get("delay")
        if await self.pause(self.latency if delay is None else delay):
            return self._error(503, "fake server shutting down")
        kind = item["type"]
        if kind == "hang":
            await self.pause(None)
            return self._error(503, "fake server shutting down")
        if kind == "error":
            return self._error(item.get("status", 500), item.get("message"), presented,
                               retry_after=item.get("retry_after"),
                               error_type=item.get("error_type"), headers=item.get("headers"))
        if body.get("stream"):
            return await self._stream(request, body, item)
        if kind in ("cut", "stream_error"):
            self.drop_connection(request)  # no response at all
            return web.Response(status=500)
        return web.json_response(self._completion(body, item))

    # -- responses -----------------------------------------------------------------------

    def _error(self, status: int, message: str | None, presented: str = "", *,
               retry_after: float | None = None, error_type: str | None = None,
               headers: dict[str, str] | None = None) -> web.Response:
        defaults = {
            401: f"Incorrect API key provided: {presented}.",
            402: "You exceeded your current quota, please check your plan and billing "
                 "details.",
            429: "Rate limit reached for requests. Please try again later.",
        }
        text = message or defaults.get(status) or (
            "The server had an error while processing your request." if status >= 500
            else "Invalid request."
        )
        err_type = error_type or _ERROR_TYPES.get(status, "server_error")
        code = {401: "invalid_api_key", 402: "insufficient_quota",
                429: "rate_limit_exceeded"}.get(status)
        headers = dict(headers or {})
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        return web.json_response(
            {"error": {"message": text, "type": err_type, "param": None, "code": code}},
            status=status, headers=headers,
        )

    def _usage(self, body: dict[str, Any], text: str, calls: list[dict[str, Any]],
               override: dict[str, int] | None) -> dict[str, Any]:
        messages = body.get("messages") or []
        prompt = approx_tokens(messages) + approx_tokens(body.get("tools") or [])
        cached = 0
        if messages and messages[0].get("role") == "system":
            prefix = json.dumps([messages[0], body.get("tools")], sort_keys=True)
            if prefix in self._seen_prefixes:
                cached = approx_tokens(messages[0].get("content") or "")
            self._seen_prefixes.add(prefix)
        completion = approx_tokens(text) if text else 0
        completion += sum(approx_tokens(c["function"]["arguments"]) for c in calls)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        usage.update(override or {})
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return usage

    def _calls(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        calls = []
        for call in item.get("calls") or []:
            args = call.get("arguments", {})
            calls.append({
                "id": call.get("id") or f"call_{next(self._ids):06d}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            })
        return calls

    def _completion(self, body: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
        text = item.get("text") or ""
        calls = self._calls(item)
        message: dict[str, Any] = {"role": "assistant", "content": text or None,
                                   "refusal": None}
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": self._usage(body, text, calls, item.get("usage")),
        }

    async def _stream(self, request: web.Request, body: dict[str, Any],
                      item: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        base = {"id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": body.get("model") or self.model,
                "system_fingerprint": None}

        async def send(delta: dict[str, Any] | None, finish: str | None = None,
                       usage: dict[str, Any] | None = None) -> None:
            chunk = dict(base)
            chunk["choices"] = [] if delta is None else [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            ]
            chunk["usage"] = usage
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        text = item.get("text") or ""
        calls = self._calls(item)
        await send({"role": "assistant", "content": "", "refusal": None})
        if item["type"] == "stream_error":
            error = {"message": item.get("message") or "Overloaded",
                     "type": item.get("error_type") or "server_error", "code": None}
            await resp.write(f"data: {json.dumps({'error': error})}\n\n".encode())
            return resp
        gate = item.get("gate")
        for piece in item.get("pieces") or split_words(text):
            if gate is not None:
                await gate.pass_one()
            elif item.get("piece_delay"):
                await asyncio.sleep(item["piece_delay"])  # bench/: a model writing slowly
            if self.first_piece_at is None:
                self.first_piece_at = time.monotonic()
            await send({"content": piece})
        if item["type"] == "cut":
            self.drop_connection(request)
            return resp
        for index, call in enumerate(calls):
            await send({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                        "function": {"name": call["function"]["name"],
                                                     "arguments": ""}}]})
            for piece in split_every(call["function"]["arguments"], 7):
                await send({"tool_calls": [{"index": index,
                                            "function": {"arguments": piece}}]})
        await send({}, finish="tool_calls" if calls else "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            await send(None, usage=self._usage(body, text, calls, item.get("usage")))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


class StreamGate:
    """Paces a streamed answer from the test (in-process fakes only): content piece *n* is
    written only once the test has allowed *n* pieces (``allow``). ``sent`` counts the
    pieces written so far. Put it in a script item as ``"gate"``."""

    def __init__(self) -> None:
        self.allowed = 0
        self.sent = 0
        self._changed = asyncio.Event()

    def allow(self, n: int = 1) -> None:
        self.allowed += n
        self._changed.set()

    def open(self) -> None:
        self.allow(1_000_000)

    async def pass_one(self) -> None:
        while self.sent >= self.allowed:
            self._changed.clear()
            await self._changed.wait()
        self.sent += 1


def validate_chat_request(body: dict[str, Any]) -> str | None:
    """What the real API would reject with a 400, as its error message; None when valid."""
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in ("minimal", "low", "medium", "high"):
        return f"Invalid value for 'reasoning_effort': {effort!r}"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    if body.get("stream_options") is not None and not body.get("stream"):
        return "The 'stream_options' parameter is only allowed when 'stream' is enabled."
    open_calls: set[str] = set()
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            return f"Invalid value for 'messages[{i}].role': {role!r}"
        if role != "tool" and open_calls:
            return ("An assistant message with 'tool_calls' must be followed by tool messages "
                    f"responding to each 'tool_call_id'. Missing: {sorted(open_calls)}")
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id not in open_calls:
                return (f"Invalid parameter: messages[{i}] with role 'tool' must be a response "
                        "to a preceding message with 'tool_calls'.")
            open_calls.discard(call_id)
            if not isinstance(msg.get("content"), (str, list)):
                return f"Invalid type for 'messages[{i}].content'"
        elif role == "assistant":
            calls = msg.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list) or not calls:
                    return f"Invalid 'messages[{i}].tool_calls': empty array."
                for j, call in enumerate(calls):
                    fn = call.get("function") or {}
                    if call.get("type") != "function" or not isinstance(call.get("id"), str):
                        return f"Invalid 'messages[{i}].tool_calls[{j}]'"
                    if len(call["id"]) > 40:
                        return f"Invalid 'messages[{i}].tool_calls[{j}].id': string too long."
                    if not isinstance(fn.get("name"), str) or not isinstance(
                        fn.get("arguments"), str
                    ):
                        return f"Invalid type for 'messages[{i}].tool_calls[{j}].function'"
                    open_calls.add(call["id"])
            elif msg.get("content") is None:
                return f"Invalid 'messages[{i}]': assistant content is required"
        elif not isinstance(msg.get("content"), (str, list)):
            return f"Invalid type for 'messages[{i}].content'"
    if open_calls:
        return f"tool_calls without responses: {sorted(open_calls)}"
    for i, tool in enumerate(body.get("tools") or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(fn, dict) or not fn.get("name"):
            return f"Invalid 'tools[{i}]'"
    return None


if __name__ == "__main__":
    FakeOpenAI.main()
