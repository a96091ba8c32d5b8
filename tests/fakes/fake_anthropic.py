"""A fake Anthropic Messages server (``POST /v1/messages``, ``GET /v1/models``).

Speaks the real HTTP protocol closely enough for the official ``anthropic`` SDK: a JSON
``message`` for non-streaming calls, and for ``stream: true`` the SSE event sequence
``message_start``, ``ping``, ``content_block_start``/``content_block_delta``/
``content_block_stop`` (``text_delta`` one word each; ``tool_use`` blocks with
``input_json_delta`` fragments), ``message_delta`` (stop_reason, usage), ``message_stop``.
Errors use Anthropic's ``{"type": "error", "error": {"type", "message"}}`` body
(``overloaded_error`` for 529); ``script_stream_error`` sends an ``error`` event mid-stream.

It validates the request the way the API does and answers 400 otherwise: strict
user/assistant alternation starting with user (the rule the provider's merging exists
for), non-empty text blocks, ``tool_use`` only in assistant turns, every ``tool_use``
answered by a ``tool_result`` in the next user turn with the results first, ids matching
``^[a-zA-Z0-9_-]+$``, ``max_tokens`` present, system blocks well-formed, extended thinking
as ``tests/fakes/anthropic_thinking.py`` describes (which also gives every response a
signed thinking block when thinking is enabled). Prompt caching is
simulated: the prefix up to the last system block with ``cache_control`` is written on first
sight (``cache_creation_input_tokens``) and read afterwards (``cache_read_input_tokens``).
``api_key=`` makes it answer 401 to any other key (``x-api-key`` or bearer token).

Usage: ``async with FakeAnthropic() as fake: AsyncAnthropic(base_url=fake.base_url, ...)``
(``base_url`` is ``http://127.0.0.1:PORT``, no ``/v1``: the SDK adds it); scripting,
threads, standalone process (``python -m tests.fakes.fake_anthropic --port 0``) and control
endpoints are described in ``tests/fakes/__init__.py``.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from aiohttp import web

from . import ScriptedModelServer, anthropic_thinking, approx_tokens, split_every, split_words

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


class FakeAnthropic(ScriptedModelServer):
    """Scriptable fake of the Anthropic Messages API (see module docstring)."""

    api_root = ""

    def __init__(self, *, api_key: str | set[str] | None = None, model: str = "claude-fake",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.api_key = api_key
        self.model = model
        self._ids = itertools.count(1)
        self._cached_prefixes: set[str] = set()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/v1/models", self._models)

    def last_user_text(self, body: dict[str, Any]) -> str:
        for msg in reversed(body.get("messages") or []):
            if msg.get("role") != "user":
                continue
            content = msg.get("content")
            if isinstance(content, str):
                return content
            texts = [b.get("text", "") for b in content or [] if b.get("type") == "text"]
            if texts:
                return "\n".join(texts)
        return ""

    # -- handlers ------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.json_response({"data": [{"type": "model", "id": self.model,
                                            "display_name": "Claude (fake)",
                                            "created_at": "2026-01-01T00:00:00Z"}],
                                  "has_more": False, "first_id": self.model,
                                  "last_id": self.model})

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self.record(request)
        # Older SDKs send x-api-key; recent ones send the key as a bearer token.
        presented = request.headers.get("x-api-key") or request.headers.get(
            "Authorization", "").removeprefix("Bearer ")
        if not self.key_ok(presented):
            return self._error(401, f"invalid x-api-key: {presented}")
        if not isinstance(body, dict):
            return self._error(400, "There was an error parsing the body of your request.")
        problem = validate_messages_request(body)
        if problem:
            return self._error(400, problem)
        item = self.next_item(body)
        delay = item.get("delay")
        if await self.pause(self.latency if delay is None else delay):
            return self._error(529, "fake server shutting down")
        kind = item["type"]
        if kind == "hang":
            await self.pause(None)
            return self._error(529, "fake server shutting down")
        if kind == "error":
            status = item.get("status", 500)
            message = item.get("message") or (
                f"invalid x-api-key: {presented}" if status == 401 else None)
            return self._error(status, message, retry_after=item.get("retry_after"),
                               error_type=item.get("error_type"), headers=item.get("headers"))
        if body.get("stream"):
            return await self._stream(request, body, item)
        if kind in ("cut", "stream_error"):
            self.drop_connection(request)
            return web.Response(status=500)
        return web.json_response(self._message(body, item))

    # -- responses -----------------------------------------------------------------------

    def _error(self, status: int, message: str | None, *, retry_after: float | None = None,
               error_type: str | None = None,
               headers: dict[str, str] | None = None) -> web.Response:
        err_type = error_type or _ERROR_TYPES.get(status, "api_error")
        headers = {"request-id": f"req_{next(self._ids)}", **(headers or {})}
        if retry_after is not None:
            headers["retry-after"] = str(retry_after)
        return web.json_response(
            {"type": "error", "error": {"type": err_type, "message": message or err_type}},
            status=status, headers=headers,
        )

    def _usage(self, body: dict[str, Any], output: str, override: dict[str, int] | None
               ) -> dict[str, Any]:
        total = approx_tokens(body.get("messages") or []) + approx_tokens(
            body.get("system") or "") + approx_tokens(body.get("tools") or [])
        read = write = 0
        prefix = _cached_prefix(body)
        if prefix is not None:
            size = min(approx_tokens(prefix), total)
            if prefix in self._cached_prefixes:
                read = size
            else:
                write = size
                self._cached_prefixes.add(prefix)
        usage = {"input_tokens": total - read - write, "output_tokens": approx_tokens(output),
                 "cache_creation_input_tokens": write, "cache_read_input_tokens": read}
        usage.update(override or {})
        return usage

    def _content(self, body: dict[str, Any], item: dict[str, Any]) -> list[dict[str, Any]]:
        """Content blocks (a thinking block first when thinking is enabled); tool_use
        ``input`` stays a string when scripted as one."""
        blocks: list[dict[str, Any]] = []
        if anthropic_thinking.enabled(body):
            blocks.append(anthropic_thinking.thinking_block(item))
        if item.get("text"):
            blocks.append({"type": "text", "text": item["text"]})
        for call in item.get("calls") or []:
            blocks.append({"type": "tool_use", "id": call.get("id") or
                           f"toolu_{next(self._ids):06d}", "name": call["name"],
                           "input": call.get("arguments", {})})
        return blocks

    def _message(self, body: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
        blocks = self._content(body, item)
        for block in blocks:
            if block["type"] == "tool_use" and isinstance(block["input"], str):
                block["input"] = {"_unparsable": block["input"]}  # JSON bodies hold objects
        has_tools = any(b["type"] == "tool_use" for b in blocks)
        return {
            "id": f"msg_{next(self._ids):06d}", "type": "message", "role": "assistant",
            "model": body.get("model") or self.model, "content": blocks,
            "stop_reason": "tool_use" if has_tools else "end_turn", "stop_sequence": None,
            "usage": self._usage(body, json.dumps(blocks), item.get("usage")),
        }

    async def _stream(self, request: web.Request, body: dict[str, Any],
                      item: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(event: str, data: dict[str, Any]) -> None:
            data = {"type": event, **data}
            await resp.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())

        blocks = self._content(body, item)
        usage = self._usage(body, json.dumps(blocks), item.get("usage"))
        await send("message_start", {"message": {
            "id": f"msg_{next(self._ids):06d}", "type": "message", "role": "assistant",
            "model": body.get("model") or self.model, "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}})
        if item["type"] == "stream_error":
            await send("error", {"error": {"type": item.get("error_type") or "overloaded_error",
                                           "message": item.get("message") or "Overloaded"}})
            return resp
        await send("ping", {})
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                await send("content_block_start", {"index": index,
                                                   "content_block": {"type": "text", "text": ""}})
                for piece in split_words(block["text"]):
                    await send("content_block_delta", {"index": index, "delta": {
                        "type": "text_delta", "text": piece}})
                if item["type"] == "cut":
                    self.drop_connection(request)
                    return resp
            elif block["type"] == "thinking":
                await send("content_block_start", {"index": index, "content_block": {
                    "type": "thinking", "thinking": "", "signature": ""}})
                for piece in split_words(block["thinking"]):
                    await send("content_block_delta", {"index": index, "delta": {
                        "type": "thinking_delta", "thinking": piece}})
                await send("content_block_delta", {"index": index, "delta": {
                    "type": "signature_delta", "signature": block["signature"]}})
            else:
                await send("content_block_start", {"index": index, "content_block": {
                    "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}})
                raw = block["input"]
                raw = raw if isinstance(raw, str) else json.dumps(raw)
                for piece in split_every(raw, 7):
                    await send("content_block_delta", {"index": index, "delta": {
                        "type": "input_json_delta", "partial_json": piece}})
            await send("content_block_stop", {"index": index})
        if item["type"] == "cut":  # a cut with no text: drop before the final events
            self.drop_connection(request)
            return resp
        has_tools = any(b["type"] == "tool_use" for b in blocks)
        await send("message_delta", {
            "delta": {"stop_reason": "tool_use" if has_tools else "end_turn",
                      "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]}})
        await send("message_stop", {})
        await resp.write_eof()
        return resp


def _cached_prefix(body: dict[str, Any]) -> str | None:
    """The cacheable prefix (tools + system up to the last cache_control block), if any."""
    system = body.get("system")
    if not isinstance(system, list):
        return None
    marked = [i for i, b in enumerate(system) if isinstance(b, dict) and b.get("cache_control")]
    if not marked:
        return None
    return json.dumps([body.get("tools") or [], system[: marked[-1] + 1]], sort_keys=True)


def validate_messages_request(body: dict[str, Any]) -> str | None:
    """What the Messages API would reject with a 400, as its error message; None if valid."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        return "max_tokens: Field required"
    problem = _validate_system(body.get("system")) or anthropic_thinking.validate_params(body)
    if problem:
        return problem
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    pending: set[str] = set()  # tool_use ids the next user turn must answer
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        expected = "user" if i % 2 == 0 else "assistant"
        if role != expected:
            return (f"messages: roles must alternate between \"user\" and \"assistant\", "
                    f"starting with \"user\" (messages.{i} is {role!r})")
        content = msg.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list) or not content:
            return f"messages.{i}: content must be a non-empty string or list"
        seen_other = False
        answered: set[str] = set()
        uses: set[str] = set()
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            where = f"messages.{i}.content.{j}"
            if kind == "text":
                if not isinstance(block.get("text"), str) or not block["text"]:
                    return f"{where}: text content blocks must be non-empty"
                seen_other = True
            elif kind == "image":  # Messages API image block (base64 source)
                src = block.get("source") or {}
                if role != "user":
                    return f"{where}: image blocks are only allowed in user messages"
                if src.get("type") != "base64" or src.get("media_type") not in (
                        "image/jpeg", "image/png", "image/gif", "image/webp") or not src.get(
                        "data"):
                    return f"{where}.source: expected base64 data with an image media_type"
                seen_other = True
            elif kind == "tool_use":
                if role != "assistant":
                    return f"{where}: tool_use blocks are only allowed in assistant messages"
                if not _ID.match(str(block.get("id", ""))) or not isinstance(
                    block.get("input"), dict
                ):
                    return f"{where}: tool_use needs an id matching {_ID.pattern} and an object input"
                uses.add(block["id"])
            elif kind == "tool_result":
                if role != "user":
                    return f"{where}: tool_result blocks are only allowed in user messages"
                if seen_other:
                    return (f"{where}: tool_result blocks must come first in the content array, "
                            "before any other content")
                if block.get("tool_use_id") not in pending:
                    return (f"{where}: unexpected tool_use_id found in tool_result blocks: "
                            f"{block.get('tool_use_id')}. Each tool_result block must have a "
                            "corresponding tool_use block in the previous message.")
                answered.add(block["tool_use_id"])
            elif kind in anthropic_thinking.BLOCK_TYPES:
                problem = anthropic_thinking.validate_block(block, role, where)
                if problem:
                    return problem
            else:
                return f"{where}.type: unsupported block type {kind!r}"
        if role == "user":
            if pending - answered:
                return (f"messages.{i}: tool_use ids were found without tool_result blocks "
                        f"immediately after: {', '.join(sorted(pending - answered))}")
            pending = set()
        else:
            pending = uses
    for i, tool in enumerate(body.get("tools") or []):
        if not isinstance(tool, dict) or not tool.get("name") or not isinstance(
            tool.get("input_schema"), dict
        ):
            return f"tools.{i}: name and input_schema are required"
    return anthropic_thinking.validate_tool_loop(body)


def _validate_system(system: Any) -> str | None:
    if system is None or isinstance(system, str):
        return None
    if not isinstance(system, list):
        return "system: Input should be a valid string or list"
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            return f"system.{i}.type: Input should be 'text'"
        if not isinstance(block.get("text"), str) or not block["text"]:
            return f"system.{i}: text content blocks must be non-empty"
        cache = block.get("cache_control")
        if cache is not None and cache.get("type") != "ephemeral":
            return f"system.{i}.cache_control.type: Input should be 'ephemeral'"
    return None


if __name__ == "__main__":
    FakeAnthropic.main()
