"""Provider plugins: entry points of the group ``tidegate.providers`` (runtime/plugins.py).

The entry point's name is a value of ``models.providers.<p>.api``; its object is a
:class:`ProviderPlugin` whose ``create(name, base_url, api_key, headers, *, clock)``
returns a provider (``runtime/providers/base.py``: ``name``, ``api`` and
``async complete(request, on_delta) -> ModelResponse``), called once per configured
provider. A plugin that fails to load leaves its ``api`` unknown: a config naming it is
refused with the list of known apis, and ``tidegate plugins doctor`` says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime import plugins
from runtime.plugins import SDK_VERSION

BUILTIN_APIS = ("openai", "anthropic")


@dataclass(frozen=True)
class ProviderPlugin:
    """``name``: the ``api`` value it serves; ``create``: see the module docstring;
    ``sdk_version``: the plugin SDK it targets."""

    name: str
    create: Callable[..., Any]
    sdk_version: str = SDK_VERSION
    description: str = ""


def provider_plugin(api: str) -> ProviderPlugin | None:
    """The loaded provider plugin serving ``api``, or None (built-in apis included)."""
    if api in BUILTIN_APIS or not isinstance(api, str):
        return None
    info = plugins.find("provider", api)
    value = plugins.load(info) if info is not None else None
    return value if value is not None and info.error is None else None


def known_apis() -> list[str]:
    """The built-in apis and those of the loaded provider plugins."""
    return [*BUILTIN_APIS, *(n for n in plugins.loaded("provider") if n not in BUILTIN_APIS)]
