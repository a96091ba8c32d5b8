"""Files a stranger sent keep tainting the turns that take them in (docs/exec.md "Tainted
turns"): reading one (``read``), attaching one (``message`` media) or a command whose
output holds one (``exec``).

A file is matched by its real path (symlinks inside the workspace followed) and by its
content: the SHA-256 of its bytes equals that of a received file (a copy, a hard link, a
renamed file). The gateway's lookups sit in ``ctx.extra``:

- ``file_taint(agent_id, rel, sha256=...) -> str | None`` (gateway/tools/context.py);
- ``exec_taint(agent_id, command, output) -> str | None`` (gateway/inbound/file_lines.py):
  the command names a received file or the inbox, or its output holds a line of one.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from pathlib import Path

import structlog

from runtime.tools.registry import ToolContext

log = structlog.get_logger(__name__)

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()  # an empty file matches nothing
MAX_HASH_BYTES = 256 * 1024 * 1024  # bigger than any received file: not hashed


def digest(data: bytes) -> str:
    """The content key of ``data`` (hex SHA-256), ``""`` for no bytes."""
    return "" if not data else hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str:
    """The content key of the regular file at ``path`` (symlinks followed), ``""`` when it
    is missing, not a regular file, empty or over :data:`MAX_HASH_BYTES`."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or not 0 < st.st_size <= MAX_HASH_BYTES:
            return ""
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return ""


def note_file_taint(ctx: ToolContext, canon: str, sha256: str = "") -> None:
    """A file that came from someone who is not an owner (an inbox file a stranger sent,
    or a file with the same bytes) taints the turn that takes it in. ``canon``: its
    canonical workspace-relative path; ``sha256``: its content key when the caller has
    the bytes (:func:`digest`), else it is hashed here."""
    lookup = ctx.extra.get("file_taint")
    if lookup is None:
        return
    if not sha256:
        sha256 = file_digest(ctx.workspace / canon)
    why = lookup(ctx.agent_id, canon, sha256=sha256 if sha256 != EMPTY_SHA256 else "")
    if why and why not in ctx.taint:
        ctx.taint.append(why)


def real_rel(workspace: Path, rel: str) -> str | None:
    """``rel`` with symlinks followed, relative to the workspace's real path; None when
    it leads outside (the tool refuses it anyway)."""
    root = workspace.resolve()
    try:
        target = (root / rel).resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return None
    if target != root and root not in target.parents:
        return None
    return target.relative_to(root).as_posix()


async def output_taint(ctx: ToolContext, command: str, output: str) -> str | None:
    """Why a command's ``output`` (or the ``command`` itself) brings a received file's
    content into a turn, or None. Reads files in a worker thread; never raises."""
    lookup = ctx.extra.get("exec_taint")
    if lookup is None:
        return None
    try:
        return await asyncio.to_thread(lookup, ctx.agent_id, command, output)
    except Exception:  # unknown means tainted: fail closed
        log.exception("exec_taint_failed", session_key=ctx.session_key)
        return "exec output that could not be checked for files from non-owners"


async def note_output_taint(ctx: ToolContext, command: str, output: str) -> str | None:
    """:func:`output_taint`, added to ``ctx.taint`` (the turn's) and returned."""
    why = await output_taint(ctx, command, output)
    if why and why not in ctx.taint:
        ctx.taint.append(why)
    return why
