"""Model prices and the cost of one model call.

Built-in prices (USD per million tokens, the providers' published list prices) cover the
common OpenAI and Anthropic models; ``pricing:`` in config adds or overrides entries, keyed
``<provider>/<model>`` or ``<model>``. A model name matches the longest known prefix, so
dated snapshots (``gpt-4o-2024-08-06``, ``claude-sonnet-4-20250514``) find their family.
A model without a price costs 0 and is reported as unpriced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.usage.config import Price

BUILTIN_PRICES: dict[str, Price] = {
    # OpenAI (input, output, cached input)
    "gpt-5": Price(input=1.25, output=10.0, cached_input=0.125),
    "gpt-5-mini": Price(input=0.25, output=2.0, cached_input=0.025),
    "gpt-5-nano": Price(input=0.05, output=0.40, cached_input=0.005),
    "gpt-4.1": Price(input=2.0, output=8.0, cached_input=0.50),
    "gpt-4.1-mini": Price(input=0.40, output=1.60, cached_input=0.10),
    "gpt-4.1-nano": Price(input=0.10, output=0.40, cached_input=0.025),
    "gpt-4o": Price(input=2.50, output=10.0, cached_input=1.25),
    "gpt-4o-mini": Price(input=0.15, output=0.60, cached_input=0.075),
    "o3": Price(input=2.0, output=8.0, cached_input=0.50),
    "o3-mini": Price(input=1.10, output=4.40, cached_input=0.55),
    "o4-mini": Price(input=1.10, output=4.40, cached_input=0.275),
    # Anthropic (cache reads 0.1x input, 5-minute cache writes 1.25x input)
    "claude-opus-4-5": Price(input=5.0, output=25.0, cached_input=0.50, cache_write=6.25),
    "claude-opus-4-1": Price(input=15.0, output=75.0, cached_input=1.50, cache_write=18.75),
    "claude-opus-4": Price(input=15.0, output=75.0, cached_input=1.50, cache_write=18.75),
    "claude-sonnet-4-5": Price(input=3.0, output=15.0, cached_input=0.30, cache_write=3.75),
    "claude-sonnet-4": Price(input=3.0, output=15.0, cached_input=0.30, cache_write=3.75),
    "claude-3-7-sonnet": Price(input=3.0, output=15.0, cached_input=0.30, cache_write=3.75),
    "claude-haiku-4-5": Price(input=1.0, output=5.0, cached_input=0.10, cache_write=1.25),
    "claude-3-5-haiku": Price(input=0.80, output=4.0, cached_input=0.08, cache_write=1.0),
}


def price_for(provider: str, model: str,
              configured: Mapping[str, Price] | None = None) -> Price | None:
    """The price of ``provider``/``model``: config ``<provider>/<model>``, then config
    ``<model>``, then the longest built-in (or configured) prefix of ``model``; None when
    unknown."""
    configured = configured or {}
    for key in (f"{provider}/{model}", model):
        if key in configured:
            return configured[key]
    table = {**BUILTIN_PRICES, **{k: v for k, v in configured.items() if "/" not in k}}
    best = max((k for k in table if model.startswith(k)), key=len, default=None)
    return table[best] if best else None


def cost_usd(usage: Mapping[str, Any], price: Price | None) -> float:
    """USD of one call. ``usage``: ``{input, output, cacheRead, cacheWrite}`` tokens, where
    ``input`` counts every prompt token (cached ones included), as both providers report
    it here (runtime/providers)."""
    if price is None:
        return 0.0
    total_in = int(usage.get("input") or 0)
    read = int(usage.get("cacheRead") or 0)
    write = int(usage.get("cacheWrite") or 0)
    fresh = max(total_in - read - write, 0)
    cached = price.cached_input if price.cached_input is not None else price.input
    writing = price.cache_write if price.cache_write is not None else price.input
    out = int(usage.get("output") or 0)
    return (fresh * price.input + read * cached + write * writing
            + out * price.output) / 1_000_000
