"""File tools ``read``, ``write``, ``edit``, confined to the agent workspace.

Paths are relative to the workspace. Absolute paths, ``..`` that leaves the workspace and
symlinks that point outside it are refused (issue 2 §7; handbook "File tools stay inside
the workspace"). Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import structlog

from runtime.fsutil import atomic_write
from runtime.skills.index import mark_used, skill_dir_of
from runtime.tools.registry import (
    ToolContext,
    ToolError,
    ToolRefused,
    require_str,
)

log = structlog.get_logger(__name__)

MAX_READ_CHARS = 100_000


def resolve_in_workspace(workspace: Path, rel: str) -> Path:
    """Resolve ``rel`` inside ``workspace`` or raise ToolError.

    Refuses absolute paths, NUL bytes, and anything whose real path (symlinks followed)
    is outside the workspace's real path.
    """
    if not rel or "\x00" in rel:
        raise ToolError("path must be a non-empty relative path")
    if os.path.isabs(rel) or rel.startswith("~"):
        raise ToolRefused(f"path {rel!r} is absolute; use a path relative to the workspace")
    root = workspace.resolve()
    target = (root / rel).resolve()
    if target != root and root not in target.parents:
        raise ToolRefused(f"path {rel!r} is outside the workspace")
    return target


def _read(path: Path, offset: int, limit: int | None) -> str:
    if not path.exists():
        raise ToolError("file not found")
    if path.is_dir():
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
        return "\n".join(names) or "(empty directory)"
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    chunk = "".join(lines[offset:offset + limit] if limit else lines[offset:])
    if len(chunk) > MAX_READ_CHARS:
        chunk = chunk[:MAX_READ_CHARS] + f"\n[truncated: {len(chunk)} chars total]"
    return chunk


def write_file(path: Path, content: str) -> None:
    """Replace ``path`` atomically with ``content`` (UTF-8), keeping its permissions."""
    try:
        mode = path.stat().st_mode & 0o7777  # editing keeps a script's permissions
    except FileNotFoundError:
        mode = 0o600  # the workspace holds private notes, like the rest of the state dir
    atomic_write(path, content.encode("utf-8"), mode=mode, durable=False)


def _note_skill_use(workspace: Path, path: Path, now: float) -> None:
    """Reading ``skills/<dir>/SKILL.md`` is using that skill: stamp its ``last_used_at``."""
    skill = skill_dir_of(workspace, path)
    if skill is None:
        return
    try:
        mark_used(workspace, skill, now=now)
    except OSError as exc:  # bookkeeping must never fail the read
        log.warning("skill_last_used_write_failed", skill=skill, error=str(exc))


def resolve_skill_file(rel: str, roots: list[Path]) -> Path | None:
    """An absolute or ``~`` path to a file inside one of the skill source ``roots`` (the
    prompt lists skills outside the workspace by such paths; reading them is allowed,
    writing is not). None when ``rel`` is not such a path."""
    if not (os.path.isabs(rel) or rel.startswith("~")) or "\x00" in rel:
        return None
    target = Path(os.path.expanduser(rel)).resolve()
    for root in roots:
        real = Path(root).resolve()
        if real in target.parents:
            return target
    return None


async def read_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    rel = require_str(args, "path")
    path = resolve_skill_file(rel, ctx.extra.get("skill_roots") or []) or \
        resolve_in_workspace(ctx.workspace, rel)
    offset = int(args.get("offset") or 0)
    limit = args.get("limit")

    def run() -> str:
        text = _read(path, max(0, offset - 1 if offset else 0), int(limit) if limit else None)
        _note_skill_use(ctx.workspace, path, ctx.clock.time())
        return text

    return await asyncio.to_thread(run)


def guard_agent_memory(ctx: ToolContext, path: Path) -> None:
    """Refuse (ToolError, logged ``memory_write_refused``) a file write to the agent's
    shared memory (``MEMORY.md``, ``memory/``) from a turn whose sender is not one of the
    agent's owners (``agents.<id>.owners``; runtime/memory/scopes.py)."""
    hub = ctx.extra.get("memory")
    if hub is None:
        return
    ws = ctx.workspace.resolve()
    try:
        rel = path.resolve().relative_to(ws).as_posix()
    except ValueError:
        return
    if rel.lower() not in ("memory.md",) and not rel.lower().startswith("memory/"):
        return
    asker = hub.asker(ctx.agent_id, ctx.scope)
    if asker.writes_agent:
        return
    import structlog
    structlog.get_logger(__name__).warning(
        "memory_write_refused", agent=ctx.agent_id, session_key=ctx.session_key,
        sender=asker.user, target=rel, reason="not_owner")
    raise ToolError(f"only the agent's owners can change {rel}")


async def write_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    rel = require_str(args, "path")
    content = require_str(args, "content", allow_empty=True)
    path = resolve_in_workspace(ctx.workspace, rel)
    guard_agent_memory(ctx, path)
    if path.is_dir() or path == ctx.workspace.resolve():
        raise ToolError(f"path {rel!r} is a directory; give a file path")
    await asyncio.to_thread(write_file, path, content)
    return f"wrote {len(content.encode('utf-8'))} bytes to {rel}"


async def edit_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    rel = require_str(args, "path")
    old = require_str(args, "old_text")
    new = require_str(args, "new_text", allow_empty=True)
    path = resolve_in_workspace(ctx.workspace, rel)
    guard_agent_memory(ctx, path)

    def apply() -> str:
        if not path.is_file():
            raise ToolError("file not found")
        text = path.read_text(encoding="utf-8")
        count = text.count(old)
        if count == 0:
            raise ToolError("old_text not found in the file")
        if count > 1:
            raise ToolError(f"old_text occurs {count} times; include more context")
        write_file(path, text.replace(old, new, 1))
        return f"edited {rel}"

    return await asyncio.to_thread(apply)
