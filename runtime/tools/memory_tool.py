"""The ``memory_search`` tool: BM25 over the agent's memory files with time windows and decay.

Wraps ``runtime.memory`` (seed 003 memory layers; seed 002 ``created_after`` /
``created_before`` and relevance × exp(−λ·Δt_hours)) as a registry :class:`Tool`. Settings
come through :class:`ToolContext`:

- ``ctx.workspace``: where ``MEMORY.md`` and ``memory/YYYY-MM-DD.md`` live;
- ``ctx.clock``: "now" for the decay (epoch seconds);
- ``ctx.extra["memory_decay_lambda"]``: λ per hour (config ``memory.time_decay_lambda``,
  default 0.0 = no decay);
- ``ctx.extra["user_timezone"]``: IANA zone for daily-note dates and local stamps
  (``agents.*.user_timezone``, default UTC).

One :class:`MemoryIndex` is kept per (workspace, timezone), so the BM25 index is built once
and rebuilt only when a memory file changes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from runtime.memory import MEMORY_SEARCH_TOOL, MemoryIndex, run_memory_search_tool
from runtime.tools.registry import Tool, ToolContext, ToolError

_indexes: dict[tuple[str, str], MemoryIndex] = {}
_guard = threading.Lock()


def memory_index(workspace: Path, tz: str = "UTC") -> MemoryIndex:
    """The cached index of ``workspace`` in timezone ``tz`` (created on first use).

    Raises ZoneInfoNotFoundError for an unknown ``tz``.
    """
    key = (str(Path(workspace).resolve()), tz)
    with _guard:
        index = _indexes.get(key)
        if index is None:
            index = _indexes[key] = MemoryIndex(workspace, tz=tz)
        return index


async def memory_search(args: dict[str, Any], ctx: ToolContext) -> str:
    """Run one ``memory_search`` call; returns the JSON result text for the model
    (``{"results": [{"path", "line", "heading", "created_at", "score", "text"}]}``).

    Raises ToolError for bad arguments (message names the argument) or a bad λ setting.
    """
    try:
        decay = float(ctx.extra.get("memory_decay_lambda") or 0.0)
    except (TypeError, ValueError):
        raise ToolError("memory_search: memory.time_decay_lambda must be a number") from None
    index = memory_index(ctx.workspace, str(ctx.extra.get("user_timezone") or "UTC"))
    try:
        return await run_memory_search_tool(index, args, now=ctx.clock.time(),
                                            decay_lambda=decay)
    except (TypeError, ValueError) as exc:
        raise ToolError(str(exc)) from None


MEMORY_TOOL = Tool(MEMORY_SEARCH_TOOL.name, MEMORY_SEARCH_TOOL.description,
                   MEMORY_SEARCH_TOOL.parameters, memory_search)
"""The registry entry (name ``memory_search``, policy group ``group:memory``)."""
