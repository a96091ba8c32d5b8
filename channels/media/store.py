"""Storing a received file in the agent workspace:
``inbox/YYYY-MM-DD/<sha256[:12]>-<safe-name>`` (issue 12), written atomically through
the workspace fd walk (runtime/tools/workspace_fs.py); the same
bytes under the same name land on the same path (a redelivery does not duplicate)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from channels.media.sniff import kind_of, sniff_mime
from runtime.clock import utc_iso
from runtime.media.ref import MediaRef
from runtime.tools import workspace_fs as wfs

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
EXTENSIONS = {"image/jpeg": ".jpg", "image/png": ".png", "image/gif": ".gif",
              "image/webp": ".webp", "audio/ogg": ".ogg", "audio/mpeg": ".mp3",
              "audio/mp4": ".m4a", "audio/wav": ".wav", "video/mp4": ".mp4",
              "video/webm": ".webm", "application/pdf": ".pdf", "text/plain": ".txt"}


def safe_name(name: str, mime: str) -> str:
    """A file-system-safe version of ``name`` (letters, digits, ``.``, ``_``, ``-``; at most
    80 chars, no leading dot) with an extension matching ``mime`` when it had none."""
    base = _UNSAFE.sub("_", name.rsplit("/", 1)[-1]).strip("._")[:80] or "file"
    if "." not in base and mime in EXTENSIONS:
        base += EXTENSIONS[mime]
    return base


def store_inbox(workspace: Path, data: bytes, name: str, *, now: float,
                folder: str = "inbox", digest: str | None = None) -> MediaRef:
    """Write ``data`` under the workspace ``folder`` (``inbox`` for received files,
    ``downloads`` for fetched ones) and return its reference (path relative to
    ``workspace``; mime sniffed from ``data``; ``digest``: its sha256 hex when the caller
    has it already). Raises OSError when the disk refuses."""
    digest = digest or hashlib.sha256(data).hexdigest()
    mime = sniff_mime(data, name)
    rel = Path(folder) / utc_iso(now)[:10] / f"{digest[:12]}-{safe_name(name, mime)}"
    if wfs.kind(workspace, rel.as_posix()) is None:  # walked from a directory fd: no link out
        wfs.write_bytes(workspace, rel.as_posix(), data, durable=True)
    return MediaRef(path=rel.as_posix(), mime=mime, size=len(data), sha256=digest,
                    name=name, kind=kind_of(mime))
