"""File tools ``read``, ``write``, ``edit``, confined to the agent workspace.

Paths are relative to the workspace. Absolute paths, ``..`` that leaves the workspace and
symlinks that point outside it are refused (issue 2 §7; handbook "File tools stay inside
the workspace"). Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from runtime.skills.index import mark_used, skill_dir_of
from runtime.tools import workspace_fs as wfs
from runtime.tools.file_taint import digest, note_file_taint
from runtime.tools.registry import (
    ToolContext,
    ToolError,
    ToolRefused,
    require_str,
)

log = structlog.get_logger(__name__)

MAX_READ_CHARS = 100_000


def resolve_in_workspace(workspace: Path, rel: str) -> Path:
    """Resolve ``rel`` inside ``workspace`` or raise ToolError: a check and a name for
    messages only. Opening the result would re-resolve the string (a component swapped
    for a symlink meanwhile leads out); file access goes through
    runtime/tools/workspace_fs.py, which walks directory fds.

    Refuses absolute paths, NUL bytes, and anything whose real path (symlinks followed)
    is outside the workspace's real path.
    """
    wfs.check_relative(rel)
    root = workspace.resolve()
    target = (root / rel).resolve()
    if target != root and root not in target.parents:
        raise ToolRefused(f"path {rel!r} is outside the workspace")
    return target


def _read(workspace: Path, rel: str, offset: int, limit: int | None
          ) -> tuple[str, str, str]:
    """(text or directory listing, canonical rel, content key of the file's bytes: ""
    for a directory; runtime/tools/file_taint.py) of ``rel``."""
    fd, canon = wfs.open_read(workspace, rel)
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        return "\n".join(wfs.list_dir(fd)) or "(empty directory)", canon, ""
    with os.fdopen(fd, "rb") as fh:
        data = fh.read()
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    chunk = "".join(lines[offset:offset + limit] if limit else lines[offset:])
    if len(chunk) > MAX_READ_CHARS:
        chunk = chunk[:MAX_READ_CHARS] + f"\n[truncated: {len(chunk)} chars total]"
    return chunk, canon, digest(data)


def write_file(workspace: Path, rel: str, content: str,
               check: Callable[[str], None] | None = None) -> str:
    """Replace workspace file ``rel`` atomically with ``content`` (UTF-8), keeping its
    permissions; ``check(canonical rel)`` may refuse first. Returns the canonical rel."""
    return wfs.write_bytes(workspace, rel, content.encode("utf-8"), check=check)


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
    skill = resolve_skill_file(rel, ctx.extra.get("skill_roots") or [])
    offset = int(args.get("offset") or 0)
    limit = args.get("limit")
    start, count = max(0, offset - 1 if offset else 0), int(limit) if limit else None

    def run() -> str:
        if skill is not None:  # outside the workspace, read-only: no race to lose
            text, path = _read(skill.parent, skill.name, start, count)[0], skill
        else:
            text, canon, sha = _read(ctx.workspace, rel, start, count)
            path = ctx.workspace.resolve() / canon
            note_file_taint(ctx, canon, sha)  # by path, and by content (a copy)
        _note_skill_use(ctx.workspace, path, ctx.clock.time())
        return text

    return await asyncio.to_thread(run)


def guard_agent_memory(ctx: ToolContext, rel: str) -> None:
    """Refuse (ToolError, logged ``memory_write_refused``) a file write to the agent's
    shared memory (``MEMORY.md``, ``memory/``; ``rel`` canonical, workspace-relative)
    from a turn whose sender is not one of the agent's owners (``agents.<id>.owners``;
    runtime/memory/scopes.py)."""
    hub = ctx.extra.get("memory")
    if hub is None:
        return
    if rel.lower() not in ("memory.md",) and not rel.lower().startswith("memory/"):
        return
    asker = hub.asker(ctx.agent_id, ctx.scope)
    if asker.writes_agent:
        return
    log.warning("memory_write_refused", agent=ctx.agent_id, session_key=ctx.session_key,
                sender=asker.user, target=rel, reason="not_owner")
    raise ToolError(f"only the agent's owners can change {rel}")


async def write_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    rel = require_str(args, "path")
    content = require_str(args, "content", allow_empty=True)
    resolve_in_workspace(ctx.workspace, rel)  # the refusal messages; the write re-walks
    await asyncio.to_thread(write_file, ctx.workspace, rel, content,
                            lambda canon: guard_agent_memory(ctx, canon))
    return f"wrote {len(content.encode('utf-8'))} bytes to {rel}"


async def edit_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    rel = require_str(args, "path")
    old = require_str(args, "old_text")
    new = require_str(args, "new_text", allow_empty=True)
    resolve_in_workspace(ctx.workspace, rel)

    def apply() -> str:
        if wfs.kind(ctx.workspace, rel) != "file":
            raise ToolError("file not found")
        text = wfs.read_bytes(ctx.workspace, rel).decode("utf-8")
        count = text.count(old)
        if count == 0:
            raise ToolError("old_text not found in the file")
        if count > 1:
            raise ToolError(f"old_text occurs {count} times; include more context")
        write_file(ctx.workspace, rel, text.replace(old, new, 1),
                   lambda canon: guard_agent_memory(ctx, canon))
        return f"edited {rel}"

    return await asyncio.to_thread(apply)
