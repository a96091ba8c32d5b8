"""Tool registry and tool policy (seed 001 §tools, §tool policy).

A tool is a name, a description, a JSON-schema of its arguments and an async handler
``handler(args: dict, ctx: ToolContext) -> str``. Handlers raise ``ToolError`` for a clear
failure; any exception becomes an error result for the model (never a crashed turn).
The policy filter applies ``agents.*.tools.allow`` / ``deny`` (names, ``*`` globs and
groups such as ``group:fs``) before the model sees the tool list.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.providers.base import ToolSpec

TOOL_GROUPS: dict[str, list[str]] = {
    "group:fs": ["read", "write", "edit"],
    "group:runtime": ["exec"],
    "group:messaging": ["message"],
    "group:memory": ["memory_search"],
    "group:automation": ["cron"],
    "group:web": ["web_fetch", "web_search"],
}


class ToolError(Exception):
    """A tool failed in a way the model should be told about (message is shown to it)."""


class ToolRefused(ToolError):
    """The call was refused by a rule (a path outside the workspace...); the turn logs
    each one as ``tool_call_refused`` with the session key."""


@dataclass
class ToolContext:
    """What a tool call may use. Callbacks are injected by the gateway; None = unavailable.

    - ``send_message(channel, to, text) -> Awaitable[str]`` delivers a message.
    - ``on_background_done(session_key, text)`` reports a finished background command.
    - ``extra`` carries gateway services for specific tools (e.g. the cron service).
    """

    workspace: Path
    session_key: str
    agent_id: str
    clock: Clock = SYSTEM_CLOCK
    exec_timeout: float = 60.0
    exec_max_output: int = 20_000
    secret_env: frozenset[str] = frozenset()
    send_message: Callable[[str, str, str], Awaitable[str]] | None = None
    on_background_done: Callable[[str, str], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


Handler = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


@dataclass(frozen=True)
class Tool:
    """``group``: the policy group of a plugin's tools (``plugin:mcp:<server>``), matched
    by allow/deny patterns like a name."""

    name: str
    description: str
    parameters: dict[str, Any]
    handler: Handler
    group: str | None = None

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)


class ToolRegistry:
    """Registered tools by name, with the policy-filtered view per agent."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools or []:
            self.register(t)

    def register(self, tool: Tool) -> None:
        self._tools[tool.name] = tool

    def unregister(self, name: str) -> None:
        self._tools.pop(name, None)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def allowed(self, allow: list[str] | None, deny: list[str]) -> list[Tool]:
        """Tools permitted by the policy: in ``allow`` (all when None) and not in ``deny``.
        An ``allow`` entry ``!pattern`` denies (``["!plugin:mcp:*"]`` = all but MCP tools)."""
        negated = [p[1:] for p in allow or [] if p.startswith("!")]
        positive = [p for p in allow or [] if not p.startswith("!")]
        if allow is not None and not positive:
            allow = None
        return [t for t in self._tools.values()
                if (allow is None or _matches(t, positive))
                and not _matches(t, deny) and not _matches(t, negated)]


def _matches(tool: Tool, patterns: list[str]) -> bool:
    for pat in patterns:
        if pat in TOOL_GROUPS and tool.name in TOOL_GROUPS[pat]:
            return True
        if fnmatch.fnmatchcase(tool.name, pat):
            return True
        if tool.group is not None and fnmatch.fnmatchcase(tool.group, pat):
            return True
    return False


def object_schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


def require_str(args: dict[str, Any], key: str, *, allow_empty: bool = False) -> str:
    """Fetch a string argument or raise ToolError naming it."""
    value = args.get(key)
    if not isinstance(value, str) or (not allow_empty and not value):
        raise ToolError(f"argument {key!r} is required and must be a string")
    return value
