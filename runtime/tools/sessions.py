"""Sessions tools (seed 001 §3 source 6, §6): ``sessions_list``, ``sessions_history``,
``sessions_send``, ``sessions_spawn`` and ``session_status``.

The runtime does not know the session store: the gateway puts an object implementing
:class:`SessionsAccess` in ``ToolContext.extra["sessions"]`` (gateway/sessions/access.py)
and one implementing :class:`SubagentAccess` in ``ToolContext.extra["subagents"]``.
Visibility (own agent only, or every agent) and the ``sessions_send`` depth limit are
enforced there; the tools validate arguments and format results.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from runtime.tools.registry import (
    ToolContext,
    ToolError,
    optional_int,
    require_str,
)


class SessionsAccess(Protocol):
    """Session operations for the tools, as seen from the calling session. Methods raise
    ``PermissionError`` (not visible / depth limit) or ``LookupError`` (no such session)."""

    def list(self, ctx: ToolContext, limit: int) -> list[dict[str, Any]]: ...

    def history(self, ctx: ToolContext, key: str, limit: int) -> list[dict[str, Any]]: ...

    async def send(self, ctx: ToolContext, key: str, text: str) -> str: ...

    def status(self, ctx: ToolContext, key: str | None) -> dict[str, Any]: ...


class SubagentAccess(Protocol):
    """Starts subagent runs. ``spawn`` returns the run record as a dict and raises
    ``PermissionError`` (depth / children limit, unknown agent) or ``RuntimeError``."""

    async def spawn(self, ctx: ToolContext, spec: dict[str, Any]) -> dict[str, Any]: ...


def _access(ctx: ToolContext, name: str) -> Any:
    access = ctx.extra.get(name)
    if access is None:
        raise ToolError(f"{name} tools are not available in this gateway")
    return access


def _call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (PermissionError, LookupError, ValueError) as exc:
        raise ToolError(str(exc).strip("'\"")) from None


async def sessions_list(args: dict[str, Any], ctx: ToolContext) -> str:
    rows = _call(_access(ctx, "sessions").list, ctx, optional_int(args, "limit", 50, lo=1,
                                                                    hi=500))
    return json.dumps({"sessions": rows}, ensure_ascii=False)


async def sessions_history(args: dict[str, Any], ctx: ToolContext) -> str:
    key = require_str(args, "key")
    # reads the transcript store, which may block (PostgreSQL): off the event loop
    rows = await asyncio.to_thread(_call, _access(ctx, "sessions").history, ctx, key,
                                   optional_int(args, "limit", 20, lo=1, hi=200))
    return json.dumps({"key": key.strip(), "messages": rows}, ensure_ascii=False)


async def sessions_send(args: dict[str, Any], ctx: ToolContext) -> str:
    key, text = require_str(args, "key"), require_str(args, "text")
    try:
        reply = await _access(ctx, "sessions").send(ctx, key, text)
    except (PermissionError, LookupError, ValueError) as exc:
        raise ToolError(str(exc).strip("'\"")) from None
    return json.dumps({"key": key.strip(), "reply": reply}, ensure_ascii=False)


async def session_status(args: dict[str, Any], ctx: ToolContext) -> str:
    key = args.get("key") if isinstance(args.get("key"), str) and args.get("key") else None
    # may read the shared subagent runs (PostgreSQL): off the event loop
    status = await asyncio.to_thread(_call, _access(ctx, "sessions").status, ctx, key)
    return json.dumps(status, ensure_ascii=False)


async def sessions_spawn(args: dict[str, Any], ctx: ToolContext) -> str:
    spec = {"task": require_str(args, "task")}
    for name in ("label", "agent", "model"):
        if args.get(name) is not None:
            spec[name] = require_str(args, name)
    cleanup = args.get("cleanup") or "keep"
    if cleanup not in ("keep", "delete"):
        raise ToolError("cleanup must be 'keep' or 'delete'")
    spec["cleanup"] = cleanup
    if args.get("timeout") is not None:
        try:
            spec["timeout"] = float(args["timeout"])
        except (TypeError, ValueError):
            raise ToolError("timeout must be a number of seconds") from None
    try:
        run = await _access(ctx, "subagents").spawn(ctx, spec)
    except (PermissionError, LookupError, ValueError, RuntimeError) as exc:
        raise ToolError(str(exc).strip("'\"")) from None
    return json.dumps({"status": "accepted", "run_id": run["run_id"],
                       "child_session_key": run["child_session_key"],
                       "note": "The subagent runs in the background; its result will arrive "
                               "as a system event. Do not wait or poll for it."})
