"""The memory tools: ``memory_search`` (BM25, or hybrid with embeddings, with time
windows and decay, over the scopes the asker sees), ``memory_get`` and ``memory_write``
(scoped: who may write where, runtime/memory/scopes.py).

Wraps ``runtime.memory`` (seed 003 memory layers; seed 002 ``created_after`` /
``created_before`` and relevance × exp(−λ·Δt_hours)): the handlers of the memory tools
that runtime/tools/sources.py declares (``memory_search``, ``memory_get``,
``memory_write``). Settings come through :class:`ToolContext`:

- ``ctx.workspace``: where ``MEMORY.md`` and ``memory/YYYY-MM-DD.md`` live;
- ``ctx.clock``: "now" for the decay (epoch seconds);
- ``ctx.extra["memory_decay_lambda"]``: λ per hour (config ``memory.time_decay_lambda``,
  default 0.0 = no decay);
- ``ctx.extra["user_timezone"]``: IANA zone for daily-note dates and local stamps
  (``agents.*.user_timezone``, default UTC);
- ``ctx.extra["memory"]``: the gateway's memory service (gateway/memory/): the agent's
  search (``search_for(agent_id)``), scope store (``store_for(agent_id)``), who asks
  (``asker(agent_id, ctx.scope)`` -> runtime.memory.scopes.Asker) and ``group_writes``.
  Without it (tests, tools run outside the gateway) only the agent scope exists.

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

import structlog

from runtime.tools import workspace_fs as wfs
from runtime.tools.fs import resolve_in_workspace
from runtime.tools.registry import (
    ToolContext,
    ToolError,
    optional_int,
    require_str,
)

if TYPE_CHECKING:  # runtime.memory (BM25 index, regexes) loads on the first memory_search
    from runtime.memory import MemoryIndex

log = structlog.get_logger(__name__)

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
    (runtime/memory/tool.py gives its shape). With the gateway's memory service
    (``ctx.extra["memory"]``) the search is hybrid where embeddings are configured and
    sees only the asker's scopes (agent + this group + the sender's own).

    Raises ToolError for bad arguments (message names the argument) or a bad λ setting.
    """
    try:
        decay = float(ctx.extra.get("memory_decay_lambda") or 0.0)
    except (TypeError, ValueError):
        raise ToolError("memory_search: memory.time_decay_lambda must be a number") from None
    from runtime.memory import run_memory_search_tool
    hub = ctx.extra.get("memory")
    if hub is not None:
        index: Any = hub.search_for(ctx.agent_id)
        scopes: list[str] | None = hub.asker(ctx.agent_id, ctx.scope).visible()
    else:
        index = memory_index(ctx.workspace, str(ctx.extra.get("user_timezone") or "UTC"))
        scopes = ["agent"]
    try:
        return await run_memory_search_tool(index, args, now=ctx.clock.time(),
                                            decay_lambda=decay, scopes=scopes)
    except (TypeError, ValueError) as exc:
        raise ToolError(str(exc)) from None


def _memory_path(workspace: Path, rel: str) -> str:
    """``MEMORY.md`` or a file under ``memory/`` (checked, workspace-relative); ToolError
    for anything else."""
    rel = rel.strip().removeprefix("./")
    if rel != "MEMORY.md" and not (rel.startswith("memory/") and rel.endswith(".md")):
        raise ToolError("path must be MEMORY.md or memory/<name>.md")
    resolve_in_workspace(workspace, rel)
    return rel


async def memory_get(args: dict[str, Any], ctx: ToolContext) -> str:
    """``memory_get {path, from_line?, lines?}``: lines of a memory file (1-based), e.g.
    around a ``memory_search`` hit. Raises ToolError for other paths or a missing file."""
    rel = _memory_path(ctx.workspace, require_str(args, "path"))
    start = optional_int(args, "from_line", 1, lo=1, hi=10**7)
    count = optional_int(args, "lines", 40, lo=1, hi=2000)

    def read() -> str:
        if wfs.kind(ctx.workspace, rel) != "file":
            raise ToolError("file not found")
        data = wfs.read_bytes(ctx.workspace, rel)
        lines = data.decode("utf-8", errors="replace").splitlines()
        chunk = lines[start - 1:start - 1 + count]
        return "\n".join(f"{start + i}: {ln}" for i, ln in enumerate(chunk)) or "(no lines)"

    return await asyncio.to_thread(read)


async def memory_write(args: dict[str, Any], ctx: ToolContext) -> str:
    """``memory_write {text, target: daily|long_term, scope?: user|group|agent}``.

    ``agent`` (the default for the operator and for an owner in a DM): append a stamped
    paragraph to today's ``memory/YYYY-MM-DD.md`` (user timezone) or to ``MEMORY.md``;
    only owners (``agents.<id>.owners``) and the operator may. ``user`` (the default for a
    platform sender otherwise): the sender's own scope. ``group``: the conversation's
    scope, when ``memory.group_writes`` allows it. The stamp ``<!-- ts: ... -->`` gives
    ``memory_search`` its ``created_at``. Raises ToolError for a refused write (logged
    as ``memory_write_refused``)."""
    text = require_str(args, "text").strip()
    if not text:  # an empty entry: an orphan stamp that /forget cannot even list
        raise ToolError("argument 'text' is empty; nothing was saved")
    target = args.get("target") or "daily"
    if target not in ("daily", "long_term"):
        raise ToolError("target must be 'daily' or 'long_term'")
    hub = ctx.extra.get("memory")
    asker = hub.asker(ctx.agent_id, ctx.scope) if hub is not None else None
    scope = _write_scope(args.get("scope"), target, asker, ctx, hub, args.get("target"))
    if scope != "agent":
        store = hub.store_for(ctx.agent_id)
        await asyncio.to_thread(store.append, scope, text, ctx.clock.time())
        return "saved for this group" if scope.startswith("group:") else \
            "saved for this person (only they will find it)"
    zone = ZoneInfo(str(ctx.extra.get("user_timezone") or "UTC"))
    now = datetime.fromtimestamp(ctx.clock.time(), zone)
    rel = f"memory/{now:%Y-%m-%d}.md" if target == "daily" else "MEMORY.md"
    resolve_in_workspace(ctx.workspace, rel)
    from runtime.memory.paragraphs import entry_text  # one write = one paragraph
    block = f"{entry_text(text)}\n<!-- ts: {now.isoformat(timespec='seconds')} -->\n"

    def append() -> None:
        exists = wfs.kind(ctx.workspace, rel) == "file"
        old = wfs.read_bytes(ctx.workspace, rel).decode("utf-8") if exists else ""
        gap = "" if not old.strip() else ("\n" if old.endswith("\n") else "\n\n")
        # a blank line: paragraphs are memory_search's units
        wfs.append_text(ctx.workspace, rel, gap + block)

    await asyncio.to_thread(append)
    return f"saved to {rel}"


def _write_scope(asked: Any, target: str, asker: Any, ctx: ToolContext, hub: Any,
                 given: Any = None) -> str:
    """The scope a ``memory_write`` goes to (``agent`` | ``user:..`` | ``group:..``), or
    ToolError (logged with the ``target`` and ``scope`` the model gave, ``given`` and
    ``asked``) when the asker may not write there. Without a scope a non-owner's
    ``target: daily`` (the default) goes to their own scope; ``long_term`` names
    MEMORY.md (the agent scope)."""
    if asked not in (None, "", "user", "group", "agent"):
        raise ToolError("scope must be 'user', 'group' or 'agent'")
    if asker is None or asker.operator:
        if asked in ("user", "group"):
            raise ToolError(f"scope {asked!r} needs a chat with a person; this turn has none")
        return "agent"
    why = {"target": given or None, "scope": asked or None}  # as the model asked
    if not asked:
        asked = "agent" if target == "long_term" or (asker.owner and asker.group is None) \
            else "user"
    if asked == "agent":
        if not asker.writes_agent:
            _refused(ctx, asker, why, "not_owner")
            what = "MEMORY.md" if target == "long_term" else "the shared agent memory"
            raise ToolError(f"only the agent's owners can write {what}; nothing was saved. "
                            "Use scope 'user' to remember it for this person.")
        return "agent"
    if asked == "group":
        if asker.group is None:
            _refused(ctx, asker, why, "not_a_group")
            raise ToolError("this chat has no group memory to write to; use scope 'user'")
        if not hub.group_writes:
            _refused(ctx, asker, why, "group_writes_off")
            raise ToolError("writing the group's memory is turned off here (memory."
                            "group_writes: false); nothing was saved. Use scope 'user' "
                            "to remember it for this person.")
        return f"group:{asker.group}"
    return f"user:{asker.user}"


def _refused(ctx: ToolContext, asker: Any, why: dict[str, Any], reason: str) -> None:
    log.warning("memory_write_refused", agent=ctx.agent_id, session_key=ctx.session_key,
                sender=asker.user, reason=reason, **why)
