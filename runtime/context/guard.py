"""The context window guard (seed 001 §2.4): before a turn, a model whose context window is
below ``context_guard.warn_below`` (32,000 tokens) is logged once; below
``context_guard.min`` (16,000) the turn is refused with an error naming the model and the
setting, so a tiny model does not fail every turn in confusing ways.

A model's window comes from ``models.providers.<p>.models.<id>.context_window``, else the
built-in table below (public model docs of OpenAI and Anthropic), else
``agents.*.context_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import Field

from runtime.config_types import ConfigModel

log = structlog.get_logger(__name__)

# Longest prefix wins. Sources: platform.openai.com/docs/models, docs.anthropic.com
# "Models overview" (standard windows, no beta long-context headers).
BUILTIN_WINDOWS: dict[str, int] = {
    "gpt-5": 400_000, "gpt-4.1": 1_047_576, "gpt-4o": 128_000, "gpt-4-turbo": 128_000,
    "gpt-4-32k": 32_768, "gpt-4": 8_192, "gpt-3.5-turbo": 16_385, "o1-mini": 128_000,
    "o1": 200_000, "o3": 200_000, "o4-mini": 200_000, "claude-": 200_000,
}


class ContextGuard(ConfigModel):
    """``agents.*.context_guard``: warn below ``warn_below`` tokens, refuse below ``min``."""

    warn_below: int = Field(32_000, ge=0,
        description="a model with a smaller context window is logged (once)")
    min: int = Field(16_000, ge=0,
        description="a model with a smaller context window is refused: the turn does not run.")


@dataclass(slots=True)
class GuardVerdict:
    """``level`` ok | warn | refuse; ``window`` tokens; ``source`` config | builtin |
    context_tokens; ``message`` for logs, validate and the refused turn's error."""

    ref: str
    window: int
    source: str
    level: str
    message: str = ""


def context_window(ref: str, providers: Mapping[str, Any], fallback: int) -> tuple[int, str]:
    """(window tokens, source) of model ``ref`` (``<provider>/<model>``)."""
    provider, _, model = ref.partition("/")
    entry = providers.get(provider)
    models = (entry.get("models") if isinstance(entry, Mapping) else
              getattr(entry, "models", None)) or {}
    info = models.get(model)
    configured = (info.get("context_window") if isinstance(info, Mapping)
                  else getattr(info, "context_window", None))
    if configured:
        return int(configured), "config"
    name = model.rsplit("/", 1)[-1].lower()
    best = max((p for p in BUILTIN_WINDOWS if name.startswith(p)), key=len, default=None)
    if best is not None:
        return BUILTIN_WINDOWS[best], "builtin"
    return fallback, "context_tokens"


def check(ref: str, providers: Mapping[str, Any], *, fallback: int, guard: ContextGuard,
          where: str = "agents.defaults") -> GuardVerdict:
    """Judge model ``ref`` against ``guard`` (``where`` names the settings in messages)."""
    window, source = context_window(ref, providers, fallback)
    if window < guard.min:
        return GuardVerdict(ref, window, source, "refuse", (
            f"model {ref} has a context window of {window:,} tokens, below "
            f"{where}.context_guard.min ({guard.min:,}); use a larger model or lower the "
            f"setting"))
    if window < guard.warn_below:
        return GuardVerdict(ref, window, source, "warn", (
            f"model {ref} has a context window of {window:,} tokens, below "
            f"{where}.context_guard.warn_below ({guard.warn_below:,})"))
    return GuardVerdict(ref, window, source, "ok")


class ContextWindowGuard:
    """Per-agent guard: ``verdict(ref)`` caches the judgement and logs a warning once per
    model."""

    def __init__(self, providers: Mapping[str, Any], *, fallback: int, guard: ContextGuard,
                 where: str) -> None:
        self.providers, self.fallback, self.guard, self.where = providers, fallback, guard, where
        self._seen: dict[str, GuardVerdict] = {}

    def verdict(self, ref: str) -> GuardVerdict:
        v = self._seen.get(ref)
        if v is None:
            v = self._seen[ref] = check(ref, self.providers, fallback=self.fallback,
                                        guard=self.guard, where=self.where)
            if v.level == "warn":
                log.warning("context_window_small", model=ref, window=v.window,
                            source=v.source, warn_below=self.guard.warn_below)
        return v
