"""Tool plugins: entry points of the group ``tidegate.tools`` (runtime/plugins.py).

The entry point's object is a :class:`ToolPlugin`; its tools register with source and
policy group ``plugin:<name>`` (``tools.deny: ["plugin:<name>"]`` removes them all) and
count as side-effecting, like MCP tools. A plugin whose tools cannot be built or whose
tool names are taken disables only itself (``tidegate plugins doctor``, status problems).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from runtime import plugins
from runtime.plugins import SDK_VERSION
from runtime.tools.registry import Tool, ToolRegistry

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ToolPlugin:
    """``name``: the plugin (its policy group is ``plugin:<name>``); ``tools``: a list of
    ``runtime.tools.registry.Tool`` or a function returning one (called once per registry);
    ``sdk_version``: the plugin SDK it targets (``runtime.plugins.SDK_VERSION``)."""

    name: str
    tools: list[Tool] | Callable[[], list[Tool]]
    sdk_version: str = SDK_VERSION
    description: str = ""


def register_tool_plugins(registry: ToolRegistry) -> list[str]:
    """Register every loaded tool plugin's tools in ``registry``; returns the names of
    the plugins registered. Failures are logged and kept on the plugin's entry."""
    done = []
    for info in plugins.discover("tool"):
        plugin: Any = plugins.load(info)
        if plugin is None or info.error:
            continue
        try:
            tools = plugin.tools() if callable(plugin.tools) else list(plugin.tools)
            if not all(isinstance(t, Tool) for t in tools):
                raise TypeError("tools must be runtime.tools.registry.Tool objects")
            registry.register_plugin(info.name, tools)
        except Exception as exc:  # noqa: BLE001 - one plugin must not stop the tools
            info.error = (f"tool plugin {info.name!r} ({info.package} {info.version}): "
                          f"{type(exc).__name__}: {exc}")
            log.error("plugin_load_failed", plugin=info.name, kind="tool",
                      package=info.package, error=info.error)
            continue
        done.append(info.name)
    return done
