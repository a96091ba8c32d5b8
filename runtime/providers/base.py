"""Provider-neutral model types and the Provider protocol.

The turn loop speaks only these types; each provider module translates them to its wire
format (OpenAI Chat Completions, Anthropic Messages). SDK-level retries are off: the
runtime owns retry and failover policy (seed 001 §failover).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal, Protocol

Role = Literal["user", "assistant", "tool"]
StopReason = Literal["stop", "tool_use", "length", "error"]


@dataclass(slots=True)
class ToolCall:
    """One tool call requested by the model. ``arguments`` is the decoded JSON object."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(slots=True)
class ChatMessage:
    """One conversation message in provider-neutral form.

    - user: ``content`` text.
    - assistant: ``content`` text (may be empty) and ``tool_calls``.
    - tool: ``content`` is the tool result text for ``tool_call_id`` (``name`` = tool name).
    """

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False


@dataclass(slots=True)
class ToolSpec:
    """A tool offered to the model: name, description and JSON-schema ``parameters``."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(slots=True)
class Usage:
    """Token usage of one model call."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(slots=True)
class ModelRequest:
    """Everything one model call needs.

    ``system`` is the byte-stable prefix (cacheable); ``system_dynamic`` is the per-turn block
    (time, drained system events) placed after it. ``timeout`` is seconds for the whole call.
    """

    model: str
    system: str
    messages: list[ChatMessage]
    system_dynamic: str = ""
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int = 4096
    temperature: float | None = None
    stream: bool = True
    timeout: float | None = 120.0


@dataclass(slots=True)
class ModelResponse:
    """The model's answer: text, tool calls, usage and why it stopped."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    stop_reason: StopReason = "stop"
    model: str = ""
    provider: str = ""
    api: str = ""


class ProviderError(Exception):
    """A failed model call.

    ``transient`` is True for errors worth retrying (timeouts, connection errors, 429, 5xx);
    ``status`` is the HTTP status when there was one; ``retry_after`` is seconds when the
    server said so. The message never contains the API key.
    """

    def __init__(
        self,
        message: str,
        *,
        transient: bool = False,
        status: int | None = None,
        retry_after: float | None = None,
        kind: str = "error",
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status
        self.retry_after = retry_after
        self.kind = kind


DeltaCallback = Callable[[str], Awaitable[None] | None]


class Provider(Protocol):
    """A model backend. One instance per configured provider, reused for every call
    (one HTTP client per provider)."""

    name: str
    api: str

    async def complete(
        self, request: ModelRequest, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        """Run one model call; stream text deltas to ``on_delta`` when given.

        Raises ProviderError on any failure.
        """

    async def close(self) -> None:
        """Release the HTTP client."""
