"""Provider-neutral model types and the Provider protocol.

The turn loop speaks only these types; each provider module translates them to its wire
format (OpenAI Chat Completions, Anthropic Messages). SDK-level retries are off: the
runtime owns retry and failover policy (seed 001 §failover).
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from runtime.providers.failover.errors import (
    RETRYABLE,
    ErrorClass,
    class_of,
    classify,
    rate_limit_wait,
)

if TYPE_CHECKING:
    from runtime.media.images import ImagePart
    from runtime.media.ref import MediaRef

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

    - user: ``content`` text; ``media`` the stored files it references (runtime/media/
      ref.py); ``images`` the image parts to send for this call (filled per model call by
      runtime/media/vision.py, never persisted).
    - assistant: ``content`` text (may be empty) and ``tool_calls``; ``thinking`` the
      provider's opaque reasoning blocks of that answer (Anthropic ``thinking`` /
      ``redacted_thinking`` blocks with their signature, exactly as received), sent back
      by that provider within the same turn's tool loop; never persisted, never shown.
    - tool: ``content`` is the tool result text for ``tool_call_id`` (``name`` = tool name);
      ``for_sender`` whose memory it shows (never sent to a provider).
    """

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    media: list[MediaRef] = field(default_factory=list)
    images: list[ImagePart] = field(default_factory=list)
    thinking: list[dict[str, Any]] = field(default_factory=list)
    # tool: the canonical sender a memory tool result belongs to (shared sessions: other
    # senders' turns see a placeholder, runtime/context/messages.py ``private_view``)
    for_sender: str | None = None
    # Wire-format encodings by provider API ("openai" -> JSON bytes), filled on first send:
    # a message is encoded once for the life of the session, not once per turn. init=False:
    # dataclasses.replace() (e.g. adding image parts) starts a copy with an empty cache.
    wire: dict[str, bytes] = field(default_factory=dict, init=False, repr=False,
                                   compare=False)


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
    api_key: str | None = field(default=None, repr=False)  # the auth profile's key
    reasoning: str | None = None  # /think: low | medium | high (None/off: the default)


# /think level -> the extra output tokens a turn may spend thinking (Anthropic's
# ``thinking.budget_tokens``, 1024 is its minimum; "Extended thinking" docs). The turn
# reserves them out of its context budget so prompt + thinking + answer fit the window.
THINKING_BUDGETS: dict[str, int] = {"low": 1024, "medium": 4096, "high": 16000}


@dataclass(slots=True)
class ModelResponse:
    """The model's answer: text, tool calls, usage and why it stopped. ``thinking``: the
    provider's opaque reasoning blocks (see ``ChatMessage.thinking``), never part of
    ``text``. ``notes``: short remarks for the user about how the answer was obtained (a
    setting the model refused), shown after the reply, never sent to the model."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    stop_reason: StopReason = "stop"
    model: str = ""
    provider: str = ""
    api: str = ""
    auth_profile: str = ""
    thinking: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


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

    @property
    def error_class(self) -> ErrorClass:
        """billing | auth | rate_limit | context_overflow | timeout | transient |
        invalid_request (runtime/providers/failover/errors.py)."""
        return class_of(self.kind, self.transient)


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


# --- helpers shared by the provider modules (additive; no type above changes) -------------

def http_error_classes() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(transport errors, timeout errors) of the HTTP libraries the SDKs may use: recent
    openai/anthropic SDKs are built on ``httpx2``, older ones on ``httpx``; a cut stream
    surfaces as the library's raw ``RemoteProtocolError``. Called by the provider modules
    (not at import of this module, to keep it cheap)."""
    transport: list[type[BaseException]] = []
    timeouts: list[type[BaseException]] = []
    for module_name in ("httpx", "httpx2"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        transport.append(module.HTTPError)
        timeouts.append(module.TimeoutException)
    return tuple(transport), tuple(timeouts)


async def emit_delta(on_delta: DeltaCallback | None, text: str) -> None:
    """Pass one text chunk to ``on_delta``, awaiting it when it is a coroutine function."""
    if on_delta is None or not text:
        return
    result = on_delta(text)
    if inspect.isawaitable(result):
        await result


def decode_tool_arguments(raw: str | None) -> dict[str, Any]:
    """Decode a model's tool-call argument JSON; never raises.

    Empty text → ``{}``. Text that is not JSON → ``{"_raw": text, "_error": "invalid JSON"}``;
    JSON that is not an object → ``{"_raw": text, "_error": "arguments are not a JSON
    object"}``, so the tool layer can report the problem back to the model.
    """
    text = raw or ""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"_raw": text, "_error": "invalid JSON"}
    if not isinstance(value, dict):
        return {"_raw": text, "_error": "arguments are not a JSON object"}
    return value


def keyed_client(client: Any, cache: dict[str, Any], api_key: str | None) -> Any:
    """``client`` itself, or (``api_key`` given: an auth profile's key) a copy of it
    sending that key, sharing its connection pool (SDK ``with_options``). Copies are cached
    per key; at most 8 are kept (refreshed tokens replace old ones)."""
    if not api_key or api_key == getattr(client, "api_key", None):
        return client
    keyed = cache.get(api_key)
    if keyed is None:
        if len(cache) >= 8:
            cache.pop(next(iter(cache)))
        keyed = cache[api_key] = client.with_options(api_key=api_key)
    return keyed


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``***`` (short secrets kept)."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "***")
    return text


def status_error(
    provider: str,
    status: int | None,
    body: Any,
    headers: Mapping[str, str] | None,
    *,
    now: float,
    secret: str | None,
) -> ProviderError:
    """Build the ProviderError for an HTTP error status, or (``status`` None) for an error
    object/event received inside a successful stream.

    ``body`` is the decoded error JSON in either the OpenAI form (``{"message", "type",
    "code"}``, optionally wrapped in ``{"error": ...}``) or the Anthropic form
    (``{"type": "error", "error": {...}}``). ``kind`` is the error class of
    ``runtime/providers/failover/errors.py`` (the one classification for both providers);
    ``retry_after`` (seconds) comes from ``Retry-After``/``retry-after-ms``/Anthropic's
    rate-limit reset headers. The message is ``"<provider>: HTTP <status> <class>: <server
    message>"`` (``stream error`` instead of ``HTTP <status>`` in-stream) with ``secret``
    redacted.
    """
    detail: Any = body
    if isinstance(detail, Mapping) and isinstance(detail.get("error"), Mapping):
        detail = detail["error"]
    err_type = code = ""
    message = ""
    if isinstance(detail, Mapping):
        err_type = str(detail.get("type") or "")
        code = str(detail.get("code") or "")
        message = str(detail.get("message") or "")
    elif detail:
        message = str(detail)
    kind = classify(status, err_type, code, message)
    where = f"HTTP {status}" if status is not None else "stream error"
    text = f"{provider}: {where} {kind}"
    if message:
        text += f": {message[:500]}"
    return ProviderError(
        redact(text, secret),
        transient=kind in RETRYABLE,
        status=status,
        retry_after=rate_limit_wait(headers, now) if kind == "rate_limit" else None,
        kind=kind,
    )


async def guarded_call(
    *,
    provider: str,
    clock: Any,
    request: ModelRequest,
    call: Callable[[], Awaitable[ModelResponse]],
    sdk_errors: tuple[type[BaseException], ...],
    map_error: Callable[[BaseException], ProviderError],
    log: Any,
) -> ModelResponse:
    """Run one provider call under ``request.timeout`` and turn every failure into a
    :class:`ProviderError` (shared by the OpenAI and Anthropic providers).

    Failures are logged at debug only: the caller (runtime/providers/failover/chain.py)
    logs them with retry context. Errors raised by ``on_delta`` callbacks propagate unchanged.
    """
    started = clock.monotonic()
    try:
        async with clock.timeout(request.timeout):
            response = await call()
    except TimeoutError:
        err = ProviderError(f"{provider}: model call timed out after {request.timeout}s",
                            transient=True, kind="timeout")
    except ProviderError as exc:
        err = exc
    except sdk_errors as exc:
        err = map_error(exc)
    else:
        response.model = response.model or request.model
        u = response.usage
        log.debug("model_call_done", provider=provider, model=response.model,
                  stop_reason=response.stop_reason, input_tokens=u.input_tokens,
                  cache_read_tokens=u.cache_read_tokens, output_tokens=u.output_tokens,
                  duration_ms=round((clock.monotonic() - started) * 1000, 1))
        return response
    if request.api_key:  # an auth profile's key never reaches a message
        err.args = (redact(str(err), request.api_key),)
    log.debug("provider_call_failed", provider=provider, model=request.model, kind=err.kind,
              status=err.status, transient=err.transient, retry_after=err.retry_after,
              error=str(err))
    raise err from None
