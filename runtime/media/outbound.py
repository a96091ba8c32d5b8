"""Files in replies: ``MEDIA: <path>`` lines become attachments (the line leaves the text),
paths confined to the workspace like the file tools (issue 12 "Files out")."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path

from runtime.fsutil import atomic_write
from runtime.tools.secrets import SecretScrubber

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


class MediaHasSecret(Exception):
    """A file to upload holds configured secret values (``names``: their names)."""

    def __init__(self, item: str, names: list[str]) -> None:
        labels = ", ".join(f"[redacted:{n}]" for n in names)
        super().__init__(f"media path {item!r} was not sent: it contains a secret ({labels})")
        self.item, self.names = item, names


def stage_media(workspace: Path, item: str, secrets: SecretScrubber,
                stage_dir: Path | None = None) -> tuple[Path, str]:
    """(a private copy of the workspace file named in a reply or the ``message`` tool,
    its canonical workspace-relative path). ``item`` is relative to the workspace or an
    absolute path inside it. The bytes are read through the fd walk
    (runtime/tools/workspace_fs.py) and the copy is what gets uploaded, so the file
    cannot be swapped for a link out, or for other bytes, after it was checked. The copy
    is ``<stage_dir>/<sha256[:16]>/<name>`` (the state dir's ``media-out``: an upload
    parked in the outbox survives a restart); without ``stage_dir`` a private temp dir.

    Raises runtime.tools.registry.ToolError when outside the workspace or not a file,
    :class:`MediaHasSecret` when its bytes hold a configured secret value."""
    from runtime.tools import workspace_fs as wfs
    from runtime.tools.registry import ToolError, ToolRefused

    rel = item
    if Path(item).is_absolute():
        rel = _inside(workspace, item)
    try:
        fd, canon = wfs.open_read(workspace, rel)
    except ToolRefused:
        raise ToolError(f"media path {item!r} is outside the workspace") from None
    except ToolError:
        raise ToolError(f"media path {item!r} is not a file in the workspace") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolError(f"media path {item!r} is not a file in the workspace")
    with os.fdopen(fd, "rb") as fh:
        data = fh.read()
    names = secrets.names_in(data)
    if names:
        raise MediaHasSecret(item, names)
    return _stage(data, Path(canon).name, stage_dir), canon


def _inside(workspace: Path, item: str) -> str:
    """Absolute ``item`` as a path relative to the workspace (its real or given path)."""
    from runtime.tools.registry import ToolError

    for root in (workspace.resolve(), Path(os.path.abspath(workspace))):
        try:
            return str(Path(os.path.normpath(item)).relative_to(root))
        except ValueError:
            continue
    raise ToolError(f"media path {item!r} is outside the workspace")


_stage_root: list[Path] = []  # one private (0700) directory per process


def _stage(data: bytes, name: str, stage_dir: Path | None) -> Path:
    """``data`` written under ``stage_dir`` (or this process's private temp dir) as
    ``<sha256[:16]>/name``."""
    if stage_dir is None:
        if not _stage_root:
            _stage_root.append(Path(tempfile.mkdtemp(prefix="tidegate-media-")))
        stage_dir = _stage_root[0]
    folder = stage_dir / hashlib.sha256(data).hexdigest()[:16]
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / name
    if not path.exists():
        atomic_write(path, data, durable=False)
    return path
