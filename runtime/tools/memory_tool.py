"""The ``memory_search`` tool: BM25 over the agent's memory files with time windows and decay.

Wraps ``runtime.memory`` (seed 003 memory layers; seed 002 ``created_after`` /
``created_before`` and relevance × exp(−λ·Δt_hours)): the handlers of the memory tools
that runtime/tools/sources.py declares (``memory_search``, ``memory_get``,
``memory_write``). Settings come through :class:`ToolContext`:

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

import asyncio
import threading
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from runtime.tools.fs import resolve_in_workspace
from runtime.tools.registry import (
    ToolContext,
    ToolError,
    optional_int,
    require_str,
)

if TYPE_CHECKING:  # runtime.memory (BM25 index, regexes) loads on the first memory_search
    from runtime.memory import MemoryIndex

_indexes: dict[tuple[str, str], MemoryIndex] = {}
_guard = threading.Lock()


def memory_index(workspace: Path, tz: str = "UTC") -> MemoryIndex:
    """The cached index of ``workspace`` in timezone ``tz`` (created on first use).

    Raises ZoneInfoNotFoundError for an unknown ``tz``.
    """
    from runtime.memory import MemoryIndex
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
    from runtime.memory import run_memory_search_tool
    index = memory_index(ctx.workspace, str(ctx.extra.get("user_timezone") or "UTC"))
    try:
        return await run_memory_search_tool(index, args, now=ctx.clock.time(),
                                            decay_lambda=decay)
    except (TypeError, ValueError) as exc:
        raise ToolError(str(exc)) from None


def _memory_path(workspace: Path, rel: str) -> Path:
    """``MEMORY.md`` or a file under ``memory/``; ToolError for anything else."""
    rel = rel.strip().removeprefix("./")
    if rel != "MEMORY.md" and not (rel.startswith("memory/") and rel.endswith(".md")):
        raise ToolError("path must be MEMORY.md or memory/<name>.md")
    return resolve_in_workspace(workspace, rel)


async def memory_get(args: dict[str, Any], ctx: ToolContext) -> str:
    """``memory_get {path, from_line?, lines?}``: lines of a memory file (1-based), e.g.
    around a ``memory_search`` hit. Raises ToolError for other paths or a missing file."""
    path = _memory_path(ctx.workspace, require_str(args, "path"))
    start = optional_int(args, "from_line", 1, lo=1, hi=10**7)
    count = optional_int(args, "lines", 40, lo=1, hi=2000)

    def read() -> str:
        if not path.is_file():
            raise ToolError("file not found")
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        chunk = lines[start - 1:start - 1 + count]
        return "\n".join(f"{start + i}: {ln}" for i, ln in enumerate(chunk)) or "(no lines)"

    return await asyncio.to_thread(read)


async def memory_write(args: dict[str, Any], ctx: ToolContext) -> str:
    """``memory_write {text, target: daily|long_term}``: append a stamped paragraph to
    today's ``memory/YYYY-MM-DD.md`` (user timezone) or to ``MEMORY.md``. The stamp
    ``<!-- ts: ... -->`` gives ``memory_search`` its ``created_at``."""
    text = require_str(args, "text").strip()
    target = args.get("target") or "daily"
    if target not in ("daily", "long_term"):
        raise ToolError("target must be 'daily' or 'long_term'")
    zone = ZoneInfo(str(ctx.extra.get("user_timezone") or "UTC"))
    now = datetime.fromtimestamp(ctx.clock.time(), zone)
    rel = f"memory/{now:%Y-%m-%d}.md" if target == "daily" else "MEMORY.md"
    path = resolve_in_workspace(ctx.workspace, rel)
    block = f"{text}\n<!-- ts: {now.isoformat(timespec='seconds')} -->\n"

    def append() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        gap = "" if not old.strip() else ("\n" if old.endswith("\n") else "\n\n")
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(gap + block)  # a blank line: paragraphs are memory_search's units

    await asyncio.to_thread(append)
    return f"saved to {rel}"
