"""Model calls with retry and failover (seed 001 §failover).

``ModelCaller.call`` tries the primary model ref (``provider/model``), retrying transient
errors (timeouts, connection errors, 429, 5xx) with exponential backoff or the server's
``Retry-After``; when a model keeps failing, or fails permanently, the next fallback is
tried. SDK retries are off, so this is the only retry policy. Without a configured model
the built-in ``echo`` provider answers.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.providers.base import DeltaCallback, ModelRequest, ModelResponse, ProviderError

log = structlog.get_logger(__name__)

ECHO_REF = "echo/diagnostic"
MAX_BACKOFF = 30.0


class ModelCallError(Exception):
    """Every model in the chain failed; ``attempts`` lists ``(model_ref, error)``."""

    def __init__(self, attempts: list[tuple[str, str]]) -> None:
        self.attempts = attempts
        detail = "; ".join(f"{ref}: {err}" for ref, err in attempts)
        super().__init__(f"all models failed ({detail})")


def split_ref(ref: str) -> tuple[str, str]:
    provider, _, model = ref.partition("/")
    if not provider or not model:
        raise ValueError(f"model ref must be <provider>/<model>, got {ref!r}")
    return provider, model


class ModelCaller:
    """One agent's model chain. ``registry.get(provider_name)`` returns a Provider."""

    def __init__(self, registry: Any, *, primary: str | None, fallbacks: list[str] | None = None,
                 timeout: float = 120.0, retries: int = 2, backoff: float = 1.0,
                 clock: Clock = SYSTEM_CLOCK, media: Any = None) -> None:
        self.registry = registry
        self.media = media  # runtime/media/vision.MediaPolicy: image parts per model
        self.chain = [primary or ECHO_REF, *(fallbacks or [])]
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.clock = clock

    async def call(self, request: ModelRequest, *, model_override: str | None = None,
                   on_delta: DeltaCallback | None = None) -> tuple[ModelResponse, float]:
        """Run the request down the chain. Returns (response, milliseconds spent in model
        calls). Raises ModelCallError when every model failed."""
        chain = [model_override, *self.chain] if model_override else self.chain
        attempts: list[tuple[str, str]] = []
        spent = 0.0
        for ref in chain:
            provider_name, model = split_ref(ref)
            try:
                provider = self.registry.get(provider_name)
            except KeyError as exc:
                attempts.append((ref, str(exc)))
                continue
            request.model = model
            request.timeout = self.timeout
            sent = await self.media.prepare(request, ref) if self.media is not None else request
            for attempt in range(self.retries + 1):
                t0 = time.perf_counter()
                try:
                    resp = await provider.complete(sent, on_delta)
                    spent += (time.perf_counter() - t0) * 1000
                    return resp, spent
                except ProviderError as exc:
                    spent += (time.perf_counter() - t0) * 1000
                    log.warning("model_call_failed", model=ref, attempt=attempt + 1,
                                transient=exc.transient, status=exc.status, error=str(exc))
                    if not exc.transient or attempt == self.retries:
                        attempts.append((ref, str(exc)))
                        break
                    delay = exc.retry_after or min(self.backoff * (2 ** attempt), MAX_BACKOFF)
                    await self.clock.sleep(delay)
            log.warning("model_failover", failed=ref, remaining=len(chain) - len(attempts))
        raise ModelCallError(attempts)
