"""OpenAI Chat Completions provider (also Ollama, vLLM, OpenRouter and other compatible servers).

Speaks the wire protocol through one thin aiohttp client per provider instance
(``openai_http.py``, which says why not the SDK), no retries of its own (the runtime owns
retry/failover, seed 001). Implements the ``Provider`` protocol of
``runtime/providers/base.py`` against https://platform.openai.com/docs/api-reference/chat
(function calling and streaming with ``stream_options.include_usage``). The model is
called streaming only when ``request.stream`` (someone consumes the deltas).

Usage mapping: ``input_tokens`` = ``prompt_tokens`` (cached tokens included),
``cache_read_tokens`` = ``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import aiohttp
import structlog

from runtime.clock import Clock, SystemClock
from runtime.providers.base import (
    ChatMessage,
    DeltaCallback,
    ModelRequest,
    ModelResponse,
    ProviderError,
    StopReason,
    ToolCall,
    Usage,
    decode_tool_arguments,
    emit_delta,
    guarded_call,
)
from runtime.providers.openai_http import OpenAIHttp
from runtime.tools.schema import tool_schema_for

log = structlog.get_logger(__name__)
REASONING_LEVELS = ("low", "medium", "high")


def _refuses_reasoning(exc: ProviderError) -> bool:
    """A 400 naming ``reasoning_effort`` (OpenAI: "Unsupported parameter:
    'reasoning_effort' is not supported with this model."; compatible servers:
    "Unrecognized request argument supplied: reasoning_effort")."""
    return exc.status == 400 and "reasoning_effort" in str(exc)

_STOP_REASONS: dict[str, StopReason] = {
    "stop": "stop",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "length",
    "content_filter": "error",
}
_MAX_TOOL_CALL_ID = 40  # OpenAI rejects longer tool_call ids (e.g. replayed from elsewhere)


def _wire_id(call_id: str) -> str:
    """A tool-call id OpenAI accepts; long foreign ids map deterministically to short ones."""
    if call_id and len(call_id) <= _MAX_TOOL_CALL_ID:
        return call_id
    return "call_" + hashlib.sha256(call_id.encode()).hexdigest()[:32]


def to_openai_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """Translate ``request.system``/``system_dynamic`` and messages into Chat Completions
    ``messages``: one system message, assistant ``tool_calls`` with JSON-encoded arguments,
    tool results as role ``tool`` with ``tool_call_id``."""
    out: list[dict[str, Any]] = []
    system = request.system
    if request.system_dynamic:
        system = f"{system}\n\n{request.system_dynamic}" if system else request.system_dynamic
    if system:
        out.append({"role": "system", "content": system})
    for msg in request.messages:
        out.append(_message(msg))
    return out


def encoded_messages(request: ModelRequest) -> list[bytes]:
    """``to_openai_messages`` as encoded JSON objects. Of the system message only the
    per-turn block (time, events) is encoded each turn; its stable prefix is encoded once
    (``_escaped``); every other message is encoded once and kept on the message
    (``ChatMessage.wire``), so a turn's encoding cost does not grow with the conversation."""
    out: list[bytes] = []
    static, dynamic = request.system, request.system_dynamic
    if static or dynamic:
        tail = (f"\n\n{dynamic}" if static else dynamic) if dynamic else ""
        out.append(b'{"role":"system","content":"' + _escaped(static) + _escaped(tail)
                   + b'"}')
    for msg in request.messages:
        data = msg.wire.get("openai")
        if data is None:
            data = msg.wire["openai"] = _dumps(_message(msg))
        out.append(data)
    return out


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


_ESCAPED: dict[str, bytes] = {}  # stable system prompts (one per agent and tool set)


def _escaped(text: str) -> bytes:
    """``text`` as the inside of a JSON string (no quotes). JSON escapes character by
    character, so ``_escaped(a) + _escaped(b)`` is the inside of ``a + b``. Texts over
    1 KB (the stable system prompt) are kept: the prefix is the same string turn after
    turn and was ~4% of a turn's CPU to encode."""
    if len(text) < 1024:
        return json.dumps(text, ensure_ascii=False)[1:-1].encode()
    hit = _ESCAPED.get(text)
    if hit is None:
        if len(_ESCAPED) >= 64:  # a few agents; a prompt edit leaves its old entry
            _ESCAPED.clear()
        hit = _ESCAPED[text] = json.dumps(text, ensure_ascii=False)[1:-1].encode()
    return hit


def _message(msg: ChatMessage) -> dict[str, Any]:
    if msg.role == "user":
        if msg.images:  # vision: text part + image_url data URLs
            parts: list[dict[str, Any]] = [{"type": "text", "text": msg.content}]
            parts += [{"type": "image_url", "image_url": {"url": img.data_url}}
                      for img in msg.images]
            return {"role": "user", "content": parts}
        return {"role": "user", "content": msg.content}
    if msg.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": _wire_id(msg.tool_call_id or ""),
            "content": msg.content,
        }
    if msg.role == "assistant":
        entry: dict[str, Any] = {"role": "assistant", "content": msg.content}
        if msg.tool_calls:
            entry["content"] = msg.content or None
            entry["tool_calls"] = [
                {
                    "id": _wire_id(call.id),
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": json.dumps(call.arguments, ensure_ascii=False),
                    },
                }
                for call in msg.tool_calls
            ]
        return entry
    raise ValueError(f"unknown message role {msg.role!r}")


def _usage(raw: Any) -> Usage:
    """Usage of a decoded ``usage`` object (None or malformed → zeros)."""
    if not isinstance(raw, dict):
        return Usage()
    details = raw.get("prompt_tokens_details")
    cached = (details.get("cached_tokens") if isinstance(details, dict) else None) or 0
    return Usage(
        input_tokens=raw.get("prompt_tokens") or 0,
        output_tokens=raw.get("completion_tokens") or 0,
        cache_read_tokens=cached,
    )


class OpenAIProvider:
    """A provider speaking OpenAI Chat Completions.

    ``base_url`` is the API root including ``/v1`` (None → ``https://api.openai.com/v1``);
    ``api_key`` None → ``"not-needed"`` (local servers); ``headers`` are sent with every
    request. ``clock`` bounds each call to ``request.timeout`` seconds (whole call,
    streaming included).
    """

    api = "openai"

    def __init__(
        self,
        name: str,
        base_url: str | None,
        api_key: str | None,
        headers: dict[str, str] | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self._api_key = api_key or "not-needed"
        self._clock: Clock = clock or SystemClock()
        self._http = OpenAIHttp(name, base_url, self._api_key, headers, self._clock.time)
        self._tools_cache: dict[tuple, tuple[list[Any], bytes]] = {}
        self._no_reasoning: set[str] = set()  # models that refused reasoning_effort

    async def complete(
        self, request: ModelRequest, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        """Run one Chat Completions call (streamed when ``request.stream``).

        Text deltas go to ``on_delta`` in order. Raises ProviderError: transient for
        timeouts, connection errors, cut streams, 408/409/429/5xx (``retry_after`` from the
        headers on 429); not transient for 400/401/403/404. Exceptions raised by
        ``on_delta`` itself propagate unchanged.
        """
        messages = encoded_messages(request)
        body: dict[str, Any] = {"model": request.model, "max_tokens": request.max_tokens}
        raw = {"tools": self._tools_json(request.tools)} if request.tools else None
        if request.temperature is not None:
            body["temperature"] = request.temperature
        effort = request.reasoning in REASONING_LEVELS
        if effort and request.model not in self._no_reasoning:
            body["reasoning_effort"] = request.reasoning  # Chat Completions' effort knob
        try:
            return await self._guarded(request, messages, body, on_delta, raw)
        except ProviderError as exc:
            if "reasoning_effort" not in body or not _refuses_reasoning(exc):
                raise
        # The model has no effort knob: answer without it, remembered for this model, so
        # /think never turns every later turn of the session into a failure.
        self._no_reasoning.add(request.model)
        del body["reasoning_effort"]
        log.warning("reasoning_effort_unsupported", provider=self.name, model=request.model,
                    level=request.reasoning)
        resp = await self._guarded(request, messages, body, on_delta, raw)
        resp.notes.append(f"/think {request.reasoning} is not supported by {request.model}: "
                          "answered without it")
        return resp

    async def _guarded(self, request: ModelRequest, messages: list[bytes],
                       body: dict[str, Any], on_delta: DeltaCallback | None,
                       raw: dict[str, bytes] | None) -> ModelResponse:
        return await guarded_call(
            provider=self.name, clock=self._clock, request=request,
            call=lambda: (self._stream(messages, body, on_delta, request.api_key, raw)
                          if request.stream else self._once(messages, body, request.api_key,
                                                            raw)),
            sdk_errors=(aiohttp.ClientError,), map_error=self._http._connection, log=log)

    def _tools_json(self, tools: list[Any]) -> bytes:
        """The ``tools`` array (schemas stripped for OpenAI), encoded once per tool list: a
        turn's tools are the same objects turn after turn (the policy's cached set)."""
        key = tuple((t.name, t.description, id(t.parameters)) for t in tools)
        hit = self._tools_cache.get(key)
        if hit is None:
            if len(self._tools_cache) >= 32:  # a few agents/scopes; never grows unbounded
                self._tools_cache.clear()
            enc = json.dumps([{"type": "function", "function": {
                "name": t.name, "description": t.description,
                "parameters": tool_schema_for("openai", t.parameters)}} for t in tools],
                ensure_ascii=False, separators=(",", ":")).encode()
            # The specs are kept with their bytes so the ids in the key stay theirs.
            hit = self._tools_cache[key] = (list(tools), enc)
        return hit[1]

    async def _once(self, messages: list[bytes], body: dict[str, Any],
                    api_key: str | None = None,
                    raw: dict[str, bytes] | None = None) -> ModelResponse:
        data = await self._http.create(messages, body, api_key, raw)
        choices = data.get("choices")
        if not choices or not isinstance(choices[0], dict):
            raise ProviderError(f"{self.name}: response has no choices", kind="bad_response")
        choice = choices[0]
        message = choice.get("message") or {}
        calls = [
            ToolCall(
                id=str(tc.get("id") or f"call_{i}"),
                name=str(tc["function"].get("name") or ""),
                arguments=decode_tool_arguments(tc["function"].get("arguments")),
            )
            for i, tc in enumerate(message.get("tool_calls") or [])
            if isinstance(tc, dict) and isinstance(tc.get("function"), dict)
        ]
        return ModelResponse(
            text=message.get("content") or "",
            tool_calls=calls,
            usage=_usage(data.get("usage")),
            stop_reason=self._stop_reason(choice.get("finish_reason"), calls),
            model=data.get("model") or "",
            provider=self.name,
            api=self.api,
        )

    async def _stream(self, messages: list[bytes], body: dict[str, Any],
                      on_delta: DeltaCallback | None, api_key: str | None = None,
                      raw: dict[str, bytes] | None = None) -> ModelResponse:
        text: list[str] = []
        slots: dict[int, dict[str, Any]] = {}  # tool-call deltas by index
        finish: str | None = None
        usage = Usage()
        model = ""
        async for chunk in self._http.stream(messages, body, api_key, raw):
            model = model or chunk.get("model") or ""
            if chunk.get("usage") is not None:
                usage = _usage(chunk["usage"])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                content = delta.get("content")
                if content:
                    text.append(content)
                    await emit_delta(on_delta, content)
                for tc in delta.get("tool_calls") or []:
                    slot = slots.setdefault(tc.get("index", 0),
                                            {"id": "", "name": "", "args": []})
                    if tc.get("id") and not slot["id"]:
                        slot["id"] = tc["id"]
                    fn = tc.get("function") or {}
                    if fn.get("name") and not slot["name"]:
                        slot["name"] = fn["name"]
                    if fn.get("arguments"):
                        slot["args"].append(fn["arguments"])
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        if finish is None:
            # Compatible servers always send a finish_reason; its absence means a cut stream.
            raise ProviderError(
                f"{self.name}: stream ended before the model finished",
                transient=True,
                kind="connection",
            )
        calls = [
            ToolCall(
                id=slot["id"] or f"call_{index}",
                name=slot["name"],
                arguments=decode_tool_arguments("".join(slot["args"])),
            )
            for index, slot in sorted(slots.items())
        ]
        return ModelResponse(
            text="".join(text),
            tool_calls=calls,
            usage=usage,
            stop_reason=self._stop_reason(finish, calls),
            model=model,
            provider=self.name,
            api=self.api,
        )

    @staticmethod
    def _stop_reason(finish: str | None, calls: list[ToolCall]) -> StopReason:
        reason = _STOP_REASONS.get(finish or "stop", "stop")
        # Some compatible servers report "stop" while returning tool calls.
        return "tool_use" if calls and reason == "stop" else reason

    async def close(self) -> None:
        """Close the connection pool (idempotent)."""
        await self._http.close()
