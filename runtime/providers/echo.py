"""The built-in echo provider: what tidegate answers with when no model is configured.

Zero latency, no network, no tools. Its reply says plainly that no model is configured and
how to configure one, then echoes the last user message, so a fresh install shows the
whole message path working (channel → session → lane → turn → delivery) before any API key
exists.
"""

from __future__ import annotations

from runtime.providers.base import (
    DeltaCallback,
    ModelRequest,
    ModelResponse,
    Usage,
    emit_delta,
)

SETUP_HINT = (
    "To use a real model, set agents.defaults.model to <provider>/<model> "
    "(for example openai/gpt-4o) and add models.providers.<provider> with api, base_url "
    "and api_key in config.yaml."
)


def _tokens(chars: int) -> int:
    # Rough, model-free estimate (~4 characters per token), never 0 for non-empty text.
    return (chars + 3) // 4


class EchoProvider:
    """Diagnostic provider (name and api ``"echo"``).

    ``complete`` replies to the last user message with a fixed explanation plus the echoed
    text, streamed to ``on_delta`` in two deltas; it never calls tools and never fails.
    Usage is estimated as characters / 4.
    """

    name = "echo"
    api = "echo"

    async def complete(
        self, request: ModelRequest, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        """Build the echo reply for ``request`` (see class docstring)."""
        said = next(
            (m.content for m in reversed(request.messages) if m.role == "user"), ""
        ).strip()
        head = "tidegate has no model configured, so this is the built-in echo provider. "
        tail = f"You said: {said or '(nothing)'}. {SETUP_HINT}"
        if request.stream:
            await emit_delta(on_delta, head)
            await emit_delta(on_delta, tail)
        text = head + tail
        prompt_chars = len(request.system) + len(request.system_dynamic) + sum(
            len(m.content) for m in request.messages
        )
        return ModelResponse(
            text=text,
            usage=Usage(input_tokens=_tokens(prompt_chars), output_tokens=_tokens(len(text))),
            stop_reason="stop",
            model=request.model or "echo",
            provider=self.name,
            api=self.api,
        )

    async def close(self) -> None:
        """Nothing to release."""
