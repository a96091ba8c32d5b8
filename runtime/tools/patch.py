"""The ``apply_patch`` tool: apply a unified diff to files in the workspace (seed 001 §3
source 3, "apply_patch").

``{patch}``: a unified diff (``--- a/path`` / ``+++ b/path`` / ``@@ -l,n +l,n @@``
hunks, as ``git diff`` or ``diff -u`` print it) touching one or more files; ``/dev/null``
as the old side creates a file, as the new side deletes it. Parsing is done by the
``unidiff`` library. Every path is confined to the workspace like the other file tools.
The patch is all-or-nothing: every hunk is checked against the current text (a hunk may
have moved by a few lines; its context must match exactly) before any file is written,
and files are replaced atomically.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.tools import workspace_fs as wfs
from runtime.tools.fs import guard_agent_memory, resolve_in_workspace, write_file
from runtime.tools.registry import ToolContext, ToolError, require_str

if TYPE_CHECKING:  # loaded by the first apply_patch call (startup stays lean)
    import unidiff

MAX_OFFSET = 200  # lines a hunk may have moved since the diff was made


@dataclass(slots=True)
class _Change:
    rel: str
    path: Path
    text: str | None  # None: delete the file


def _strip_prefix(name: str) -> str:
    return name[2:] if name[:2] in ("a/", "b/") else name


def _find(lines: list[str], old: list[str], start: int) -> int:
    """Where ``old`` occurs in ``lines``, nearest to ``start``; -1 when nowhere near."""
    for delta in range(MAX_OFFSET + 1):
        for pos in (start - delta, start + delta):
            if 0 <= pos <= len(lines) - len(old) and lines[pos:pos + len(old)] == old:
                return pos
    return -1


def _apply_hunks(rel: str, text: str, pfile: unidiff.PatchedFile) -> str:
    lines = text.splitlines(keepends=True)
    shift = 0
    for n, hunk in enumerate(pfile, 1):
        old = [ln.value for ln in hunk if ln.line_type in (" ", "-")]
        new = [ln.value for ln in hunk if ln.line_type in (" ", "+")]
        if old and lines and not lines[-1].endswith("\n") and old[-1] == lines[-1] + "\n":
            lines[-1] += "\n"  # the diff tool's "\ No newline at end of file" case
        start = max(hunk.source_start - 1, 0) + shift
        pos = _find(lines, old, start) if old else min(start, len(lines))
        if pos < 0:
            raise ToolError(f"{rel}: hunk {n} (@@ -{hunk.source_start},{hunk.source_length}) "
                            f"does not match the file; read it and make a fresh patch")
        lines[pos:pos + len(old)] = new
        shift += len(new) - len(old)
    return "".join(lines)


def _plan(workspace: Path, patch: str) -> list[_Change]:
    import unidiff
    try:
        pset = unidiff.PatchSet(patch)
    except unidiff.UnidiffParseError as exc:
        raise ToolError(f"not a valid unified diff: {exc}") from None
    if not len(pset):
        raise ToolError("the patch contains no file changes (expected --- / +++ / @@ lines)")
    changes: list[_Change] = []
    for pfile in pset:
        removed = pfile.is_removed_file
        rel = _strip_prefix(pfile.source_file if removed else pfile.target_file)
        path = resolve_in_workspace(workspace, rel)  # refusals; reads and writes walk fds
        if pfile.is_added_file:
            if wfs.kind(workspace, rel) is not None:
                raise ToolError(f"{rel}: the patch creates it but it already exists")
            current = ""
        else:
            if wfs.kind(workspace, rel) != "file":
                raise ToolError(f"{rel}: file not found")
            current = wfs.read_bytes(workspace, rel).decode("utf-8")
        changes.append(_Change(rel, path, None if removed else
                               _apply_hunks(rel, current, pfile)))
    return changes


def _commit(workspace: Path, changes: list[_Change], ctx: ToolContext) -> str:
    done = []
    for c in changes:
        if c.text is None:
            wfs.unlink(workspace, c.rel)
            done.append(f"deleted {c.rel}")
        else:
            write_file(workspace, c.rel, c.text, lambda canon: guard_agent_memory(ctx, canon))
            done.append(f"patched {c.rel}")
    return "; ".join(done)


async def apply_patch_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    """Handler of ``apply_patch``. Raises ToolError (nothing written) when any file is
    outside the workspace, missing, or a hunk does not match."""
    patch = require_str(args, "patch")
    if not patch.endswith("\n"):
        patch += "\n"
    changes = await asyncio.to_thread(_plan, ctx.workspace, patch)
    root = ctx.workspace.resolve()
    for c in changes:  # all or nothing: refused before any file changes
        guard_agent_memory(ctx, c.path.relative_to(root).as_posix())
    return await asyncio.to_thread(_commit, ctx.workspace, changes, ctx)
