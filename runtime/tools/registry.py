"""Tool registry: the tools of every source, in a fixed order (seed 001 §3).

A tool is a name, a description, a JSON schema of its arguments and an async handler
``handler(args: dict, ctx: ToolContext) -> str``. Handlers raise ``ToolError`` for a clear
failure; any exception becomes an error result for the model (never a crashed turn).

Each tool knows its ``source`` (one of :data:`SOURCE_ORDER`; plugin tools
``plugin:<plugin>``, e.g. ``plugin:mcp:github``), its policy ``group`` (``group:fs`` ...)
and whether it has ``side_effects`` (the inbound journal re-runs a turn after a crash only
when no side-effecting tool ran). Channel tools carry ``platforms``: they exist only in
turns that came from one of those platforms. The assembled list is ordered by source,
then by registration order, so the model sees a stable tool list.

Which tools a turn gets is decided by the policy pipeline (``runtime.tools.policy``).
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.providers.base import ToolSpec
from runtime.tools.secrets import NO_SECRETS, SecretScrubber

SOURCE_ORDER = ("core", "runtime", "messaging", "memory", "automation", "sessions", "web",
                "channel", "plugin")
"""Sources in assembly order (seed 001 §3: core, exec/process, channel, own, plugin)."""

GROUPS = ("group:fs", "group:runtime", "group:messaging", "group:memory", "group:sessions",
          "group:automation", "group:web", "group:channel")
"""Policy groups every gateway knows (a group may be empty, e.g. group:web without web
tools); plugin groups ``plugin:<name>`` come from the registered plugin tools."""


class ToolError(Exception):
    """A tool failed in a way the model should be told about (message is shown to it)."""


class ToolRefused(ToolError):
    """The call was refused by a rule (a path outside the workspace...); the turn logs
    each one as ``tool_call_refused`` with the session key."""


@dataclass
class ToolContext:
    """What a tool call may use. Callbacks are injected by the gateway; None = unavailable.

    - ``send_message(channel, to, text) -> Awaitable[str]`` delivers a message.
    - ``on_background_done(session_key, text, taint)`` reports a finished background
      command; ``taint`` (a tuple of reasons) is what tainted the turn that started it
      (and its output, when it holds a file a stranger sent): the turn its system event
      wakes is tainted by it.
    - ``extra`` carries gateway services for specific tools (e.g. the cron service).
    - ``scope`` describes the turn (channel, account, chat type, group, route, subagent
      depth; ``runtime.tools.policy.ToolScope``); None outside a turn.
    - ``secret_env``: variable names commands never get; ``secrets`` scrubs configured
      secret values out of every tool result (runtime/tools/secrets.py).
    - ``gate(tool, args, ctx, session_id) -> Awaitable[str | None]`` is awaited before any
      tool runs, outside the tool timeout (it may wait for a human's approval): a string
      is the result the model gets instead of running the tool (denied, timed out).
    - ``taint``: what untrusted content reached this turn so far ("web_fetch of
      https://..."), filled by the turn (runtime/tools/taint.py); the gate reads it.
    - ``before_side_effect(run_id, tool) -> Awaitable[None]`` is awaited before a tool
      with ``side_effects`` runs: its journal mark is durable when it returns (replicas:
      the work row's ``tools``), so a takeover never re-runs that turn blindly.
    - ``on_taint(run_id, why) -> Awaitable[None]`` is awaited when a tool result taints
      the turn (replicas: the work row's ``taint``), so the turn re-run by a takeover is
      tainted too; on one host the intake journal keeps it (the ``turn_tainted`` event).
    """

    workspace: Path
    session_key: str
    agent_id: str
    clock: Clock = SYSTEM_CLOCK
    exec_timeout: float = 60.0
    exec_max_output: int = 20_000
    secret_env: frozenset[str] = frozenset()
    secrets: SecretScrubber = NO_SECRETS
    send_message: Callable[[str, str, str], Awaitable[str]] | None = None
    on_background_done: Callable[[str, str, tuple[str, ...]], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    scope: Any = None
    before_side_effect: Callable[[str, str], Awaitable[None]] | None = None
    on_taint: Callable[[str, str], Awaitable[None]] | None = None
    gate: Callable[[str, dict[str, Any], Any, str], Awaitable[str | None]] | None = None
    taint: list[str] = field(default_factory=list)


Handler = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


@dataclass(frozen=True)
class Tool:
    """One tool. ``source``/``group`` place it in the assembly and the policy;
    ``side_effects`` says whether running it changes something outside the turn;
    ``platforms`` (channel tools only) the platforms whose turns get it."""

    name: str
    description: str
    parameters: dict[str, Any]
    handler: Handler
    source: str = "core"
    group: str | None = None
    side_effects: bool = False
    platforms: frozenset[str] | None = None

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)


def _source_rank(source: str) -> int:
    head = "plugin" if source.startswith("plugin:") else source
    return SOURCE_ORDER.index(head) if head in SOURCE_ORDER else len(SOURCE_ORDER)


class ToolRegistry:
    """Registered tools by name. ``assembled()`` is every tool in source order.

    ``on_change`` callbacks run after a plugin registers or unregisters tools (the policy
    cache listens to it)."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        self.declared_plugins: set[str] = set()
        self.on_change: list[Callable[[], None]] = []
        for t in tools or []:
            self.register(t)

    def register(self, tool: Tool) -> None:
        """Add (or replace) a tool. A tool whose group is a plugin group (``plugin:...``,
        as the MCP manager registers ``plugin:mcp:<server>`` tools one by one) gets that
        group as its source and counts as side-effecting. Raises ValueError for an
        unknown source."""
        if tool.group and tool.group.startswith("plugin:") and tool.source != tool.group:
            tool = replace(tool, source=tool.group, side_effects=True)
        if _source_rank(tool.source) == len(SOURCE_ORDER):
            raise ValueError(f"tool {tool.name!r}: unknown source {tool.source!r}")
        self._tools[tool.name] = tool
        if tool.source.startswith("plugin:"):
            self._changed()

    def unregister(self, name: str) -> None:
        """Remove one tool (unknown names are ignored)."""
        tool = self._tools.pop(name, None)
        if tool is not None and tool.source.startswith("plugin:"):
            self._changed()

    def declare_plugin(self, plugin: str) -> None:
        """Announce a plugin whose tools register later (a configured MCP server that is
        still connecting), so policy entries naming ``plugin:<plugin>`` are not reported
        as unknown meanwhile."""
        self.declared_plugins.add(plugin)

    def register_plugin(self, plugin: str, tools: list[Tool]) -> list[Tool]:
        """Register a plugin's tools with source and group ``plugin:<plugin>`` (``plugin``
        ``"mcp:github"`` -> ``plugin:mcp:github``), replacing that plugin's previous tools.
        Every plugin tool counts as side-effecting (we cannot know what it does). Raises
        ValueError when a name is taken by another source. Returns the stored tools."""
        source = f"plugin:{plugin}"
        clash = [t.name for t in tools if t.name in self._tools
                 and self._tools[t.name].source != source]
        if clash:
            raise ValueError(f"plugin {plugin!r}: tool names already taken: {clash}")
        self._drop_source(source)
        stored = [replace(t, source=source, group=source, side_effects=True) for t in tools]
        for t in stored:
            self._tools[t.name] = t
        self._changed()
        return stored

    def unregister_plugin(self, plugin: str) -> None:
        """Remove every tool of ``plugin`` (a disconnected MCP server)."""
        if self._drop_source(f"plugin:{plugin}"):
            self._changed()

    def _drop_source(self, source: str) -> bool:
        names = [n for n, t in self._tools.items() if t.source == source]
        for n in names:
            del self._tools[n]
        return bool(names)

    def _changed(self) -> None:
        for cb in list(self.on_change):
            cb()

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return [t.name for t in self.assembled()]

    def assembled(self) -> list[Tool]:
        """Every tool, ordered by source (:data:`SOURCE_ORDER`) then registration."""
        order = {n: i for i, n in enumerate(self._tools)}
        return sorted(self._tools.values(), key=lambda t: (_source_rank(t.source),
                                                           order[t.name]))

    def side_effecting(self, name: str) -> bool:
        """Whether tool ``name`` has side effects (unknown tools count as side-effecting)."""
        tool = self._tools.get(name)
        return True if tool is None else tool.side_effects

    def groups(self) -> set[str]:
        """The known groups: :data:`GROUPS` plus every plugin group present."""
        return set(GROUPS) | {t.group for t in self._tools.values() if t.group}


def deferred(target: str) -> Handler:
    """A handler named ``"package.module:function"``, imported by its first call: the
    registry and the model need only a tool's declaration, so a tool's code loads when the
    tool is first used (issue 9, cold start). Raises ImportError/AttributeError then for a
    wrong name (tests/test_tool_sources.py resolves every built-in one)."""
    module, _, name = target.partition(":")

    async def handler(args: dict[str, Any], ctx: ToolContext) -> str:
        return await getattr(importlib.import_module(module), name)(args, ctx)

    handler.__qualname__ = handler.__name__ = name
    handler.target = target  # type: ignore[attr-defined] - what it runs, for tests/doctor
    return handler


def object_schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


def require_str(args: dict[str, Any], key: str, *, allow_empty: bool = False) -> str:
    """Fetch a string argument or raise ToolError naming it."""
    value = args.get(key)
    if not isinstance(value, str) or (not allow_empty and not value):
        raise ToolError(f"argument {key!r} is required and must be a string")
    return value


def optional_int(args: dict[str, Any], key: str, default: int, *, lo: int = 0,
                 hi: int = 10_000) -> int:
    """An optional integer argument clamped to [lo, hi]; ToolError naming it when bad."""
    value = args.get(key)
    if value is None:
        return default
    try:
        return max(lo, min(int(value), hi))
    except (TypeError, ValueError):
        raise ToolError(f"argument {key!r} must be an integer") from None
