"""The tool policy pipeline (seed 001 §4): layers that can only narrow the tool set.

The assembled tools (``ToolRegistry.assembled()``) first lose the channel tools of other
platforms (layer 0, "source"), then pass the layers in order — 1 ``tools.profile``,
2 ``tools.by_provider.<p>.profile``, 3 ``tools.allow/deny``, 4 ``tools.by_provider.<p>``,
5 ``agents.<id>.tools``, 6 ``agents.<id>.tools.by_provider.<p>``, 7 group/DM level, and 8
the subagent layer for subagent runs. Each layer sees only what the layer above passed
on, so nothing below can re-add a tool a layer above removed.

A layer removes a tool when its ``allow`` list (if set) does not list it, when a ``!name``
negation inside ``allow`` matches it, or when a ``deny`` entry matches it. An ``allow``
made only of negations means "everything except". Entries: names and ``*`` globs match
tool names; ``group:*`` and ``plugin:*`` entries match the tool's group (``plugin:mcp``
also matches ``plugin:mcp:github``).

:class:`ToolPolicy` caches the result per scope (agent, provider, channel, account, group,
subagent) until :meth:`ToolPolicy.invalidate` (config reload, plugin tools changed).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from runtime.providers.base import ToolSpec
from runtime.tools.registry import Tool, ToolRegistry

log = structlog.get_logger(__name__)

PROFILES: dict[str, tuple[str, ...] | None] = {
    "minimal": ("session_status",),
    "coding": ("group:fs", "group:runtime", "group:memory", "group:sessions", "group:web"),
    "messaging": ("group:messaging", "group:channel", "sessions_list", "sessions_history",
                  "sessions_send", "session_status"),
    "full": None,
}
"""What each ``tools.profile`` allows (None: everything)."""


@dataclass(frozen=True, slots=True)
class ToolScope:
    """Who is asking for tools. ``provider`` is the provider name of the agent's primary
    model (``models.providers`` key, ``echo`` without one); ``channel``/``account``/
    ``chat_type``/``group_id`` describe where the turn came from (``group_id`` None for
    DMs); ``subagent_depth`` > 0 for subagent runs. ``route`` (where the turn replies) and
    ``message_id`` (the message being answered) are for channel tools and are not part of
    the cache key, nor is ``send_chain`` (the sessions a nested ``sessions_send`` came
    through, caller first), nor ``asker`` (whose memory the turn's memory calls use:
    runtime/memory/scopes.py; None = the operator), nor ``stranger`` (``channel:sender``
    when the turn acts for a sender who is not an owner: the sessions tools then reach
    only the turn's own session and its subagents; None = an owner or the operator)."""

    agent_id: str
    provider: str = "echo"
    channel: str | None = None
    account: str = "default"
    chat_type: str = "dm"
    group_id: str | None = None
    subagent_depth: int = 0
    route: Any = field(default=None, compare=False, hash=False)
    message_id: str | None = field(default=None, compare=False, hash=False)
    send_chain: tuple[str, ...] = field(default=(), compare=False, hash=False)
    asker: Any = field(default=None, compare=False, hash=False)  # runtime.memory.scopes.Asker
    stranger: str | None = field(default=None, compare=False, hash=False)

    @property
    def cache_key(self) -> tuple:
        return (self.agent_id, self.provider, self.channel, self.account,
                self.group_id if self.chat_type != "dm" else None, self.subagent_depth > 0)


@dataclass(frozen=True, slots=True)
class Layer:
    """One policy layer: ``number`` (0-8), ``name`` and the config ``path`` of its rules."""

    number: int
    name: str
    path: str
    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()

    @classmethod
    def of(cls, number: int, name: str, path: str, allow: Iterable[str] | None,
           deny: Iterable[str] = ()) -> Layer:
        return cls(number, name, path, tuple(allow) if allow is not None else None,
                   tuple(deny))

    def refusal(self, tool: Tool) -> str | None:
        """The entry that removes ``tool`` at this layer (``"!exec"``, ``"deny: exec"``,
        ``"allow: not listed"``), or None when it passes."""
        if self.allow is not None:
            positives = [e for e in self.allow if not e.startswith("!")]
            for entry in self.allow:
                if entry.startswith("!") and entry_matches(entry[1:], tool):
                    return entry
            if positives and not any(entry_matches(e, tool) for e in positives):
                return "allow: not listed"
        for entry in self.deny:
            if entry_matches(entry, tool):
                return f"deny: {entry}"
        return None


@dataclass(frozen=True, slots=True)
class Removal:
    """Why a tool is not in the final set: the layer and the entry that removed it."""

    tool: str
    layer: int
    layer_name: str
    path: str
    entry: str

    def as_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "layer": self.layer, "layer_name": self.layer_name,
                "path": self.path, "entry": self.entry}


@dataclass(slots=True)
class Resolution:
    """The final tool set of a scope (ordered as assembled), what was removed and why,
    and the tool specs for the model."""

    scope: ToolScope
    tools: dict[str, Tool]
    removed: list[Removal]
    layers: list[Layer]
    specs: list[ToolSpec] = field(default_factory=list)

    def refusal(self, name: str) -> Removal | None:
        return next((r for r in self.removed if r.tool == name), None)


def entry_matches(entry: str, tool: Tool) -> bool:
    """Whether one allow/deny entry (without ``!``) matches ``tool``."""
    if entry.startswith(("group:", "plugin:")):
        group = tool.group or ""
        return fnmatch.fnmatchcase(group, entry) or group.startswith(entry + ":")
    return fnmatch.fnmatchcase(tool.name, entry)


def resolve(tools: list[Tool], layers: list[Layer], scope: ToolScope) -> Resolution:
    """Run ``tools`` through the source filter and ``layers`` (in order) for ``scope``."""
    removed: list[Removal] = []
    current: list[Tool] = []
    for t in tools:
        if t.platforms is not None and (scope.channel or "") not in t.platforms:
            removed.append(Removal(t.name, 0, "source", "channel tools",
                                   f"only in turns from {', '.join(sorted(t.platforms))}"))
        else:
            current.append(t)
    for layer in layers:
        passed = []
        for t in current:
            why = layer.refusal(t)
            if why is None:
                passed.append(t)
            else:
                removed.append(Removal(t.name, layer.number, layer.name, layer.path, why))
        current = passed
    final = {t.name: t for t in current}
    return Resolution(scope, final, removed, layers, [t.spec for t in current])


def unknown_entries(entries: Iterable[tuple[str, str]], registry: ToolRegistry,
                    declared_plugins: Iterable[str] = ()) -> list[str]:
    """Diagnostics for ``(config_path, entry)`` pairs that match no known tool or group:
    ``"tools.allow: 'exex' matches no known tool or group"``. ``declared_plugins`` are
    plugin names whose tools may register later (configured MCP servers)."""
    tools = registry.assembled()
    groups = registry.groups() | {f"plugin:{p}" for p in declared_plugins}
    out = []
    for path, raw in entries:
        entry = raw.removeprefix("!")
        if not entry or _known(entry, tools, groups):
            continue
        out.append(f"{path}: {raw!r} matches no known tool or group")
    return out


def _known(entry: str, tools: list[Tool], groups: set[str]) -> bool:
    if entry.startswith(("group:", "plugin:")):
        if entry in ("plugin:*", "plugin:mcp:*"):
            return True  # wildcards over plugins that may not be connected yet
        return any(fnmatch.fnmatchcase(g, entry) or g.startswith(entry + ":") for g in groups)
    return any(fnmatch.fnmatchcase(t.name, entry) for t in tools)


def refuse_call(tools: Resolution, name: str, *, session_key: str, run_id: str) -> str:
    """Enforcement at execution: log the refused call (structured WARNING
    ``tool_call_refused`` with the session key, tool, layer and entry) and return the
    error result the model gets."""
    why = tools.refusal(name)
    log.warning("tool_call_refused", session_key=session_key, run_id=run_id, tool=name,
                agent=tools.scope.agent_id, layer=why.layer if why else None,
                layer_name=why.layer_name if why else None,
                entry=why.entry if why else "unknown tool")
    if why is None:
        return f"error: unknown tool {name!r}; use only the tools you were given"
    return (f"error: tool {name!r} is not allowed here (removed by tool policy layer "
            f"{why.layer} {why.layer_name}, {why.path}: {why.entry}); use only the tools "
            f"you were given")


class ToolPolicy:
    """The cached pipeline. ``layers_of(scope)`` gives the layers for a scope (built from
    config by the gateway); ``resolve(scope)`` returns the cached :class:`Resolution`."""

    def __init__(self, registry: ToolRegistry,
                 layers_of: Callable[[ToolScope], list[Layer]]) -> None:
        self.registry = registry
        self.layers_of = layers_of
        self._cache: dict[tuple, Resolution] = {}
        self.computed = 0
        registry.on_change.append(self.invalidate)

    def resolve(self, scope: ToolScope) -> Resolution:
        key = scope.cache_key
        hit = self._cache.get(key)
        if hit is None:
            hit = resolve(self.registry.assembled(), self.layers_of(scope), scope)
            self._cache[key] = hit
            self.computed += 1
        return hit

    def invalidate(self) -> None:
        """Forget every cached set (config reloaded or plugin tools changed)."""
        self._cache.clear()

    def detach(self) -> None:
        """Stop listening to the registry (the policy was replaced on reload)."""
        if self.invalidate in self.registry.on_change:
            self.registry.on_change.remove(self.invalidate)
