"""OpenAI Chat Completions provider (also Ollama, vLLM, OpenRouter and other compatible servers).

Built on the official ``openai`` SDK with one ``AsyncOpenAI`` client per provider instance,
SDK retries off (the runtime owns retry/failover, seed 001). Implements the ``Provider``
protocol of ``runtime/providers/base.py`` against
https://platform.openai.com/docs/api-reference/chat (function calling and streaming with
``stream_options.include_usage``).

Usage mapping: ``input_tokens`` = ``prompt_tokens`` (cached tokens included),
``cache_read_tokens`` = ``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import openai
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
    http_error_classes,
    keyed_client,
    redact,
    status_error,
)

log = structlog.get_logger(__name__)

HTTP_ERRORS, HTTP_TIMEOUTS = http_error_classes()

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
    if raw is None:
        return Usage()
    details = getattr(raw, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) or 0
    return Usage(
        input_tokens=raw.prompt_tokens or 0,
        output_tokens=raw.completion_tokens or 0,
        cache_read_tokens=cached,
    )


class OpenAIProvider:
    """A provider speaking OpenAI Chat Completions.

    ``base_url`` is the API root including ``/v1`` (None → the SDK default
    ``https://api.openai.com/v1``); ``api_key`` None → ``"not-needed"`` (local servers);
    ``headers`` are sent with every request. ``clock`` bounds each call to
    ``request.timeout`` seconds (whole call, streaming included).
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
        self._keyed: dict[str, Any] = {}  # auth-profile keys -> client copies (one pool)
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=self._api_key,
            max_retries=0,
            default_headers=headers or None,
        )

    async def complete(
        self, request: ModelRequest, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        """Run one Chat Completions call (streamed when ``request.stream``).

        Text deltas go to ``on_delta`` in order. Raises ProviderError: transient for
        timeouts, connection errors, cut streams, 408/409/429/5xx (``retry_after`` from the
        headers on 429); not transient for 400/401/403/404. Exceptions raised by
        ``on_delta`` itself propagate unchanged.
        """
        # Messages and tools are already wire-format dicts: sending them as ``extra_body``
        # skips the SDK's per-call param transform, which walks every message and cost
        # ~0.25 ms of CPU per message (50 ms per call at 200 messages, growing with the
        # session). ``extra_body`` keys replace the placeholders in the JSON body.
        body: dict[str, Any] = {"messages": to_openai_messages(request)}
        kwargs: dict[str, Any] = {
            "model": request.model,
            "messages": [],
            "max_tokens": request.max_tokens,
            "timeout": request.timeout,
            "extra_body": body,
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        client = keyed_client(self._client, self._keyed, request.api_key)
        return await guarded_call(
            provider=self.name, clock=self._clock, request=request,
            call=lambda: (self._stream(client, kwargs, on_delta) if request.stream
                          else self._once(client, kwargs)),
            sdk_errors=(openai.OpenAIError, *HTTP_ERRORS), map_error=self._map_error, log=log)

    async def _once(self, client: Any, kwargs: dict[str, Any]) -> ModelResponse:
        resp = await client.chat.completions.create(**kwargs)
        if not resp.choices:
            raise ProviderError(f"{self.name}: response has no choices", kind="bad_response")
        choice = resp.choices[0]
        calls = [
            ToolCall(
                id=tc.id,
                name=tc.function.name,
                arguments=decode_tool_arguments(tc.function.arguments),
            )
            for tc in (choice.message.tool_calls or [])
            if getattr(tc, "function", None) is not None
        ]
        return ModelResponse(
            text=choice.message.content or "",
            tool_calls=calls,
            usage=_usage(resp.usage),
            stop_reason=self._stop_reason(choice.finish_reason, calls),
            model=resp.model or "",
            provider=self.name,
            api=self.api,
        )

    async def _stream(self, client: Any, kwargs: dict[str, Any],
                      on_delta: DeltaCallback | None) -> ModelResponse:
        stream = await client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
        text: list[str] = []
        slots: dict[int, dict[str, Any]] = {}  # tool-call deltas by index
        finish: str | None = None
        usage = Usage()
        model = ""
        try:
            async for chunk in stream:
                model = model or chunk.model or ""
                if chunk.usage is not None:
                    usage = _usage(chunk.usage)
                for choice in chunk.choices:
                    delta = choice.delta
                    if delta is not None and delta.content:
                        text.append(delta.content)
                        await emit_delta(on_delta, delta.content)
                    for tc in (delta.tool_calls if delta is not None else None) or []:
                        slot = slots.setdefault(tc.index, {"id": "", "name": "", "args": []})
                        if tc.id and not slot["id"]:
                            slot["id"] = tc.id
                        if tc.function is not None:
                            if tc.function.name and not slot["name"]:
                                slot["name"] = tc.function.name
                            if tc.function.arguments:
                                slot["args"].append(tc.function.arguments)
                    if choice.finish_reason:
                        finish = choice.finish_reason
        finally:
            await stream.close()
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

    def _map_error(self, exc: BaseException) -> ProviderError:
        """Translate an SDK/httpx exception; the API key never reaches the message."""
        if isinstance(exc, (openai.APITimeoutError, *HTTP_TIMEOUTS)):
            return ProviderError(f"{self.name}: model call timed out", transient=True, kind="timeout")
        if isinstance(exc, (openai.APIConnectionError, *HTTP_ERRORS)):
            cause = exc.__cause__ or exc
            detail = redact(f"{type(cause).__name__}: {cause}", self._api_key)[:300]
            return ProviderError(
                f"{self.name}: connection error ({detail})", transient=True, kind="connection"
            )
        if isinstance(exc, openai.APIStatusError):
            return status_error(
                self.name,
                exc.status_code,
                exc.body,
                exc.response.headers,
                now=self._clock.time(),
                secret=self._api_key,
            )
        if isinstance(exc, openai.APIError):
            # An error object inside an otherwise successful stream: server-side trouble.
            return status_error(
                self.name, None, exc.body or exc.message, None,
                now=self._clock.time(), secret=self._api_key,
            )
        detail = redact(f"{type(exc).__name__}: {exc}", self._api_key)[:300]
        return ProviderError(f"{self.name}: {detail}", transient=False, kind="bad_response")

    async def close(self) -> None:
        """Close the HTTP client (idempotent)."""
        await self._client.close()
