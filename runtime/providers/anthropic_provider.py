"""Anthropic Messages provider.

Built on the official ``anthropic`` SDK with one ``AsyncAnthropic`` client per provider
instance, SDK retries off (the runtime owns retry/failover, seed 001). Implements the
``Provider`` protocol of ``runtime/providers/base.py`` against
https://docs.anthropic.com/en/api/messages (tools, streaming events, prompt caching).

Prompt caching: the byte-stable ``request.system`` is sent as the first system block with
``cache_control: {"type": "ephemeral"}`` (the cached prefix then covers tools + stable
system); ``request.system_dynamic`` follows as a second, uncached block (DESIGN.md "Prompt
layout").

Usage mapping: ``input_tokens`` = uncached input + cache reads + cache writes (all prompt
tokens, as OpenAI counts them); ``cache_read_tokens``/``cache_write_tokens`` from
``cache_read_input_tokens``/``cache_creation_input_tokens``.
"""

from __future__ import annotations

import re
from typing import Any

import anthropic
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
from runtime.tools.schema import tool_schema_for

log = structlog.get_logger(__name__)

HTTP_ERRORS, HTTP_TIMEOUTS = http_error_classes()

_STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "refusal": "stop",
    "tool_use": "tool_use",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
}
_BAD_ID_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


def _wire_id(call_id: str) -> str:
    """A tool_use id Anthropic accepts (``^[a-zA-Z0-9_-]+$``); foreign ids such as
    ``functions.write:0`` are rewritten the same way on the tool_use and tool_result side."""
    return _BAD_ID_CHARS.sub("_", call_id) or "toolu_missing"


def system_blocks(request: ModelRequest) -> list[dict[str, Any]]:
    """The ``system`` parameter: stable prefix (cache_control ephemeral), then the dynamic
    block. Empty parts are left out (the API rejects empty text blocks)."""
    blocks: list[dict[str, Any]] = []
    if request.system:
        blocks.append(
            {"type": "text", "text": request.system, "cache_control": {"type": "ephemeral"}}
        )
    if request.system_dynamic:
        blocks.append({"type": "text", "text": request.system_dynamic})
    return blocks


def to_anthropic_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Translate provider-neutral messages into Messages API ``messages``.

    Assistant tool calls become ``tool_use`` blocks; tool results become user-role
    ``tool_result`` blocks. Consecutive same-role messages are merged into one (the API
    requires user/assistant alternation), with ``tool_result`` blocks first in a merged
    user message as the API demands. Empty text blocks are dropped.
    """
    out: list[dict[str, Any]] = []
    for msg in messages:
        role, blocks = _blocks(msg)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for entry in out:
        if entry["role"] == "user":
            # Stable partition: every tool_result before any other block.
            entry["content"].sort(key=lambda block: block["type"] != "tool_result")
    return out


def _blocks(msg: ChatMessage) -> tuple[str, list[dict[str, Any]]]:
    if msg.role == "user":
        blocks = [{"type": "image", "source": {"type": "base64", "media_type": img.mime,
                                                "data": img.data}} for img in msg.images]
        return "user", blocks + ([{"type": "text", "text": msg.content}] if msg.content else [])
    if msg.role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": _wire_id(msg.tool_call_id or "")}
        if msg.content:
            block["content"] = msg.content
        if msg.is_error:
            block["is_error"] = True
        return "user", [block]
    if msg.role == "assistant":
        blocks: list[dict[str, Any]] = []
        if msg.content:
            blocks.append({"type": "text", "text": msg.content})
        for call in msg.tool_calls:
            blocks.append(
                {"type": "tool_use", "id": _wire_id(call.id), "name": call.name, "input": call.arguments}
            )
        return "assistant", blocks
    raise ValueError(f"unknown message role {msg.role!r}")


def _usage(raw: Any, into: Usage | None = None) -> Usage:
    """Fold an SDK usage object into ``into`` (fields the event leaves out are kept)."""
    usage = into or Usage()
    if raw is None:
        return usage
    fresh = getattr(raw, "input_tokens", None)
    read = getattr(raw, "cache_read_input_tokens", None)
    write = getattr(raw, "cache_creation_input_tokens", None)
    if read is not None:
        usage.cache_read_tokens = read
    if write is not None:
        usage.cache_write_tokens = write
    if fresh is not None:
        usage.input_tokens = fresh + usage.cache_read_tokens + usage.cache_write_tokens
    output = getattr(raw, "output_tokens", None)
    if output is not None:
        usage.output_tokens = output
    return usage


class AnthropicProvider:
    """A provider speaking the Anthropic Messages API.

    ``base_url`` is the API root without ``/v1`` (None → the SDK default
    ``https://api.anthropic.com``); ``api_key`` None → ``"not-needed"``; ``headers`` are
    sent with every request. ``clock`` bounds each call to ``request.timeout`` seconds.
    """

    api = "anthropic"

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
        self._client = anthropic.AsyncAnthropic(
            base_url=base_url,
            api_key=self._api_key,
            max_retries=0,
            default_headers=headers or None,
        )

    async def complete(
        self, request: ModelRequest, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        """Run one Messages call (streamed when ``request.stream``).

        Text deltas go to ``on_delta`` in order; ``tool_use`` input is assembled from
        ``input_json_delta`` events. Raises ProviderError with the same classification as
        the OpenAI provider (``base.status_error``); an ``error`` event mid-stream (e.g.
        ``overloaded_error``) and a cut stream are transient. Exceptions raised by
        ``on_delta`` itself propagate unchanged.
        """
        # Messages, system and tools are already wire-format dicts: sending them as
        # ``extra_body`` skips the SDK's per-call param transform, whose cost grows with the
        # number of messages. ``extra_body`` keys replace the placeholders in the JSON body.
        body: dict[str, Any] = {"messages": to_anthropic_messages(request.messages)}
        kwargs: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "messages": [],
            "timeout": request.timeout,
            "extra_body": body,
        }
        system = system_blocks(request)
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": tool_schema_for("anthropic", t.parameters)}
                for t in request.tools
            ]
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        client = keyed_client(self._client, self._keyed, request.api_key)
        return await guarded_call(
            provider=self.name, clock=self._clock, request=request,
            call=lambda: (self._stream(client, kwargs, on_delta) if request.stream
                          else self._once(client, kwargs)),
            sdk_errors=(anthropic.AnthropicError, *HTTP_ERRORS), map_error=self._map_error, log=log)

    async def _once(self, client: Any, kwargs: dict[str, Any]) -> ModelResponse:
        msg = await client.messages.create(**kwargs)
        text: list[str] = []
        calls: list[ToolCall] = []
        for block in msg.content:
            if block.type == "text":
                text.append(block.text)
            elif block.type == "tool_use":
                args = block.input if isinstance(block.input, dict) else {
                    "_raw": str(block.input), "_error": "arguments are not a JSON object"
                }
                calls.append(ToolCall(id=block.id, name=block.name, arguments=args))
        return ModelResponse(
            text="".join(text),
            tool_calls=calls,
            usage=_usage(msg.usage),
            stop_reason=_STOP_REASONS.get(msg.stop_reason or "end_turn", "stop"),
            model=msg.model or "",
            provider=self.name,
            api=self.api,
        )

    async def _stream(self, client: Any, kwargs: dict[str, Any],
                      on_delta: DeltaCallback | None) -> ModelResponse:
        stream = await client.messages.create(**kwargs, stream=True)
        text: list[str] = []
        tools: dict[int, dict[str, Any]] = {}  # content-block index → tool_use being built
        usage = Usage()
        model = ""
        stop: str | None = None
        finished = False
        try:
            async for event in stream:
                kind = event.type
                if kind == "message_start":
                    model = event.message.model or ""
                    usage = _usage(event.message.usage, usage)
                elif kind == "content_block_start":
                    block = event.content_block
                    if block.type == "tool_use":
                        tools[event.index] = {"id": block.id, "name": block.name, "json": []}
                    elif block.type == "text" and block.text:
                        text.append(block.text)
                        await emit_delta(on_delta, block.text)
                elif kind == "content_block_delta":
                    delta = event.delta
                    if delta.type == "text_delta":
                        text.append(delta.text)
                        await emit_delta(on_delta, delta.text)
                    elif delta.type == "input_json_delta" and event.index in tools:
                        tools[event.index]["json"].append(delta.partial_json)
                elif kind == "message_delta":
                    stop = event.delta.stop_reason or stop
                    usage = _usage(event.usage, usage)
                elif kind == "message_stop":
                    finished = True
        finally:
            await stream.close()
        if not finished:
            raise ProviderError(
                f"{self.name}: stream ended before message_stop",
                transient=True,
                kind="connection",
            )
        calls = [
            ToolCall(
                id=slot["id"],
                name=slot["name"],
                arguments=decode_tool_arguments("".join(slot["json"])),
            )
            for _, slot in sorted(tools.items())
        ]
        return ModelResponse(
            text="".join(text),
            tool_calls=calls,
            usage=usage,
            stop_reason=_STOP_REASONS.get(stop or "end_turn", "stop"),
            model=model,
            provider=self.name,
            api=self.api,
        )

    def _map_error(self, exc: BaseException) -> ProviderError:
        """Translate an SDK/httpx exception; the API key never reaches the message."""
        if isinstance(exc, (anthropic.APITimeoutError, *HTTP_TIMEOUTS)):
            return ProviderError(f"{self.name}: model call timed out", transient=True, kind="timeout")
        if isinstance(exc, (anthropic.APIConnectionError, *HTTP_ERRORS)):
            cause = exc.__cause__ or exc
            detail = redact(f"{type(cause).__name__}: {cause}", self._api_key)[:300]
            return ProviderError(
                f"{self.name}: connection error ({detail})", transient=True, kind="connection"
            )
        if isinstance(exc, anthropic.APIStatusError):
            status = exc.status_code
            if status < 400:
                # An ``error`` event inside a 200 stream (overloaded_error, api_error, ...).
                return status_error(
                    self.name, None, exc.body, None, now=self._clock.time(), secret=self._api_key
                )
            return status_error(
                self.name,
                status,
                exc.body,
                exc.response.headers,
                now=self._clock.time(),
                secret=self._api_key,
            )
        detail = redact(f"{type(exc).__name__}: {exc}", self._api_key)[:300]
        return ProviderError(f"{self.name}: {detail}", transient=False, kind="bad_response")

    async def close(self) -> None:
        """Close the HTTP client (idempotent)."""
        await self._client.close()

