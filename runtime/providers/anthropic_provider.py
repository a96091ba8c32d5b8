"""Anthropic Messages provider.

Built on the official ``anthropic`` SDK with one ``AsyncAnthropic`` client per provider
instance, SDK retries off (the runtime owns retry/failover, seed 001). Implements the
``Provider`` protocol of ``runtime/providers/base.py`` against
https://docs.anthropic.com/en/api/messages (tools, streaming events, prompt caching).

Prompt caching: the byte-stable ``request.system`` is sent as the first system block with
``cache_control: {"type": "ephemeral"}`` (the cached prefix then covers tools + stable
system); ``request.system_dynamic`` follows as a second, uncached block (DESIGN.md "Prompt
layout").

Extended thinking (``/think``): ``request.reasoning`` low/medium/high sends ``thinking:
{"type": "enabled", "budget_tokens": 1024 | 4096 | 16000}`` with ``max_tokens`` raised to the
budget + ``request.max_tokens`` (the budget counts against ``max_tokens`` and must stay below
it) and no ``temperature`` (the API takes only the default with thinking). Thinking blocks
(``thinking``/``redacted_thinking``, streamed as ``thinking_delta``/``signature_delta``) are
returned in ``ModelResponse.thinking``, never in ``text`` or ``on_delta``; sent back in front
of their assistant message's ``tool_use`` blocks, as the API requires within a tool loop
(https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking). A tool loop whose
last assistant message has none (written by another provider after failover, or read back
from the transcript) is continued without thinking for that call.

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
from runtime.providers.anthropic_response import (
    THINKING_TYPES,
    StreamAssembly,
    read_content,
    usage_of,
)
from runtime.providers.base import (
    THINKING_BUDGETS,
    ChatMessage,
    DeltaCallback,
    ModelRequest,
    ModelResponse,
    ProviderError,
    StopReason,
    ToolCall,
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
        blocks: list[dict[str, Any]] = [dict(b) for b in msg.thinking
                                        if b.get("type") in THINKING_TYPES]
        if msg.content:
            blocks.append({"type": "text", "text": msg.content})
        for call in msg.tool_calls:
            blocks.append(
                {"type": "tool_use", "id": _wire_id(call.id), "name": call.name, "input": call.arguments}
            )
        return "assistant", blocks
    raise ValueError(f"unknown message role {msg.role!r}")


def _loop_keeps_thinking(messages: list[dict[str, Any]]) -> bool:
    """False when the request continues a tool loop (its last user message holds
    tool_result blocks) whose assistant message does not start with a thinking block."""
    if len(messages) < 2 or messages[-1]["role"] != "user" or not any(
            b["type"] == "tool_result" for b in messages[-1]["content"]):
        return True
    return messages[-2]["content"][0]["type"] in THINKING_TYPES


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
        # thinking/temperature travel in the body too: SDK releases differ in which of
        # them ``create()`` takes as keywords (2.x has no ``temperature``)
        budget = self._thinking_budget(request, body["messages"])
        if budget is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
            kwargs["max_tokens"] = request.max_tokens + budget
        elif request.temperature is not None:  # thinking takes only the default temperature
            body["temperature"] = request.temperature
        client = keyed_client(self._client, self._keyed, request.api_key)
        return await guarded_call(
            provider=self.name, clock=self._clock, request=request,
            call=lambda: (self._stream(client, kwargs, on_delta) if request.stream
                          else self._once(client, kwargs)),
            sdk_errors=(anthropic.AnthropicError, *HTTP_ERRORS), map_error=self._map_error, log=log)

    def _thinking_budget(self, request: ModelRequest,
                         messages: list[dict[str, Any]]) -> int | None:
        """The thinking budget (tokens) of this call; None: thinking off for it."""
        budget = THINKING_BUDGETS.get(request.reasoning or "")
        if budget is not None and not _loop_keeps_thinking(messages):
            # The API would refuse thinking here (400): the tool loop's assistant message
            # carries no thinking block to continue from.
            log.info("anthropic_thinking_skipped", provider=self.name,
                     reason="tool loop continues an assistant message without thinking")
            return None
        return budget

    async def _once(self, client: Any, kwargs: dict[str, Any]) -> ModelResponse:
        msg = await client.messages.create(**kwargs)
        text, calls, thinking = read_content(msg.content)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            thinking=thinking,
            usage=usage_of(msg.usage),
            stop_reason=_STOP_REASONS.get(msg.stop_reason or "end_turn", "stop"),
            model=msg.model or "",
            provider=self.name,
            api=self.api,
        )

    async def _stream(self, client: Any, kwargs: dict[str, Any],
                      on_delta: DeltaCallback | None) -> ModelResponse:
        stream = await client.messages.create(**kwargs, stream=True)
        got = StreamAssembly()
        try:
            async for event in stream:
                await emit_delta(on_delta, got.feed(event))
        finally:
            await stream.close()
        if not got.finished:
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
            for _, slot in sorted(got.tools.items())
        ]
        return ModelResponse(
            text="".join(got.text),
            tool_calls=calls,
            thinking=[block for _, block in sorted(got.thinking.items())],
            usage=got.usage,
            stop_reason=_STOP_REASONS.get(got.stop or "end_turn", "stop"),
            model=got.model,
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

