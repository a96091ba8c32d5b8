"""Files in replies: ``MEDIA: <path>`` lines become attachments (the line leaves the text),
paths confined to the workspace like the file tools (issue 12 "Files out")."""

from __future__ import annotations

import re
from pathlib import Path

from runtime.tools.fs import resolve_in_workspace

_MEDIA_LINE = re.compile(r"^[ \t]*MEDIA:[ \t]*(\S.*?)[ \t]*$", re.MULTILINE)


def split_media_lines(text: str) -> tuple[str, list[str]]:
    """(text without its ``MEDIA:`` lines, the paths they named in order). Lines inside
    fenced code blocks are left alone (a model explaining the syntax)."""
    out, found, fence = [], [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
        m = None if fence else _MEDIA_LINE.match(line)
        if m:
            found.append(m.group(1).strip("`\"'<>"))
        else:
            out.append(line)
    return ("\n".join(out).strip() if found else text), found


def resolve_media_path(workspace: Path, item: str) -> Path:
    """Absolute path of a workspace file named in a reply or the ``message`` tool. Accepts
    a path relative to the workspace or an absolute one inside it. Raises
    runtime.tools.registry.ToolError when outside the workspace or not a file."""
    from runtime.tools.registry import ToolError

    root = workspace.resolve()
    rel = item
    if Path(item).is_absolute():
        try:
            rel = str(Path(item).resolve().relative_to(root))
        except ValueError:
            raise ToolError(f"media path {item!r} is outside the workspace") from None
    path = resolve_in_workspace(workspace, rel)
    if not path.is_file():
        raise ToolError(f"media path {item!r} is not a file in the workspace")
    return path
