"""Model references and the provider registry (``models.providers`` in config.yaml).

A model reference is ``<provider>/<model>`` (``openai/gpt-4o``,
``openrouter/meta-llama/llama-3``: the first ``/`` separates). The registry builds one
provider instance per configured provider on first use and reuses it (one HTTP client per
provider, DESIGN.md "Performance"); ``echo`` is always available.
"""

from __future__ import annotations

from typing import Any

import structlog

from runtime.clock import Clock
from runtime.providers.base import Provider
from runtime.providers.echo import EchoProvider
from runtime.providers.plugins import known_apis, provider_plugin
from runtime.providers.slots import ProviderSlots

log = structlog.get_logger(__name__)

APIS = ("openai", "anthropic")
_KEYS = {"api", "base_url", "api_key", "headers", "auth_profiles",
         "models",  # models: per-model options (vision, context_window)
         "max_concurrent"}
_ALIASES = {"baseUrl": "base_url", "apiKey": "api_key",  # OpenClaw-style camelCase
            "maxConcurrent": "max_concurrent"}


def parse_model_ref(ref: str) -> tuple[str, str]:
    """Split ``"<provider>/<model>"`` at the first ``/`` → ``(provider, model)``.

    Raises ValueError when ``ref`` has no ``/`` or either part is empty (TypeError when it
    is not a string).
    """
    if not isinstance(ref, str):
        raise TypeError(f"model reference must be a string like 'openai/gpt-4o', got {ref!r}")
    provider, sep, model = ref.strip().partition("/")
    if not sep or not provider or not model:
        raise ValueError(
            f"model reference {ref!r} must be '<provider>/<model>', e.g. 'openai/gpt-4o' "
            "or 'anthropic/claude-sonnet-4-5'"
        )
    return provider, model


def _normalise(name: str, raw: Any) -> dict[str, Any]:
    """Validate one ``models.providers.<name>`` entry; errors name the config path."""
    where = f"models.providers.{name}"
    if not isinstance(raw, dict):
        # ValueError like every other config error, so the loader reports them uniformly.
        raise ValueError(f"{where}: expected a mapping with api, base_url, api_key")
    entry = {_ALIASES.get(k, k): v for k, v in raw.items()}
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
    api = entry.get("api")
    if api not in APIS and provider_plugin(api) is None:
        raise ValueError(f"{where}.api: must be one of {', '.join(known_apis())}, got "
                         f"{api!r}")
    for key in ("base_url", "api_key"):
        if entry.get(key) is not None and not isinstance(entry[key], str):
            raise ValueError(f"{where}.{key}: must be a string")
    headers = entry.get("headers")
    if headers is not None and not (
        isinstance(headers, dict) and all(isinstance(v, str) for v in headers.values())
    ):
        raise ValueError(f"{where}.headers: must map header names to strings")
    limit = entry.get("max_concurrent")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                              or limit < 1):
        raise ValueError(f"{where}.max_concurrent: must be an integer >= 1 or null")
    return entry


class ProviderRegistry:
    """Configured providers by name, created lazily and cached.

    ``providers_config`` maps a provider name to ``{"api": "openai"|"anthropic",
    "base_url": str|None, "api_key": str|None, "headers": dict|None}`` (camelCase
    ``baseUrl``/``apiKey`` accepted). A missing ``api_key`` (local servers such as Ollama)
    is sent as ``"not-needed"``. Raises ValueError at construction for an invalid entry or
    a provider named ``echo`` (reserved). ``clock`` bounds model calls to
    ``ModelRequest.timeout``.
    """

    def __init__(
        self, providers_config: dict[str, dict[str, Any]] | None, *, clock: Clock | None = None
    ) -> None:
        config = providers_config or {}
        if "echo" in config:
            raise ValueError("models.providers.echo: 'echo' is the built-in provider's name")
        self._config = {name: _normalise(name, raw) for name, raw in config.items()}
        self._clock = clock
        self._providers: dict[str, Provider] = {"echo": EchoProvider()}
        self.slots = ProviderSlots({n: e.get("max_concurrent") for n, e in self._config.items()})

    def slot(self, name: str, control: object = None):
        """Async context manager holding one of provider ``name``'s ``max_concurrent``
        slots (``ProviderSlots.hold``)."""
        return self.slots.hold(name, control)

    @property
    def names(self) -> list[str]:
        """Configured provider names (sorted), plus ``echo``."""
        return sorted(self._config) + ["echo"]

    def get(self, name: str) -> Provider:
        """The provider called ``name``, created on first use.

        Raises KeyError naming the configured providers when ``name`` is unknown.
        """
        provider = self._providers.get(name)
        if provider is not None:
            return provider
        entry = self._config.get(name)
        if entry is None:
            configured = ", ".join(sorted(self._config)) or "none"
            raise KeyError(
                f"unknown model provider {name!r}; configured providers: {configured} "
                "(plus the built-in 'echo'); add it under models.providers in config.yaml"
            )
        # SDKs are imported on first use: together they take ~2 s to import, which CLI
        # commands and echo-only setups should not pay.
        if entry["api"] == "openai":
            from runtime.providers.openai_provider import OpenAIProvider as cls
        elif entry["api"] == "anthropic":
            from runtime.providers.anthropic_provider import AnthropicProvider as cls
        else:  # a provider plugin (runtime/providers/plugins.py)
            cls = provider_plugin(entry["api"]).create
        provider = cls(
            name,
            entry.get("base_url"),
            entry.get("api_key") or "not-needed",
            entry.get("headers"),
            clock=self._clock,
        )
        self._providers[name] = provider
        log.info("provider_created", provider=name, api=entry["api"])
        return provider

    def resolve(self, ref: str) -> tuple[Provider, str]:
        """``"<provider>/<model>"`` → (provider, model). Raises ValueError or KeyError."""
        provider_name, model = parse_model_ref(ref)
        return self.get(provider_name), model

    async def close(self) -> None:
        """Close every provider created so far; later ``get`` calls create fresh ones."""
        providers, self._providers = self._providers, {"echo": EchoProvider()}
        for name, provider in providers.items():
            try:
                await provider.close()
            except Exception as exc:  # noqa: BLE001 - one failing close must not leak the rest
                log.warning("provider_close_failed", provider=name, error=repr(exc))
