"""Model providers: provider-neutral types, the OpenAI and Anthropic providers, the echo
provider and the registry that resolves ``<provider>/<model>`` references.

``OpenAIProvider`` and ``AnthropicProvider`` are imported on first access (PEP 562): the
two SDKs take ~2 s to import, which processes that never call a model should not pay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime.providers.base import (
    ChatMessage,
    DeltaCallback,
    ModelRequest,
    ModelResponse,
    Provider,
    ProviderError,
    ToolCall,
    ToolSpec,
    Usage,
)
from runtime.providers.echo import EchoProvider
from runtime.providers.registry import ProviderRegistry, parse_model_ref

if TYPE_CHECKING:
    from runtime.providers.anthropic_provider import AnthropicProvider
    from runtime.providers.openai_provider import OpenAIProvider

__all__ = [
    "AnthropicProvider",
    "ChatMessage",
    "DeltaCallback",
    "EchoProvider",
    "ModelRequest",
    "ModelResponse",
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "ProviderRegistry",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "parse_model_ref",
]

_LAZY = {
    "OpenAIProvider": "runtime.providers.openai_provider",
    "AnthropicProvider": "runtime.providers.anthropic_provider",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
