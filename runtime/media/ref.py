"""``MediaRef``: what a transcript, the timeline and a model message hold for a stored file
— never the bytes (issue 12 "Media in")."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

KINDS = ("image", "audio", "video", "document")


@dataclass(frozen=True, slots=True)
class MediaRef:
    """A file stored in an agent workspace.

    ``path`` is relative to the workspace (``inbox/YYYY-MM-DD/<sha256[:12]>-<safe-name>``);
    ``name`` is the sender's file name (untrusted text); ``mime`` was sniffed from the bytes;
    ``size`` in bytes; ``kind`` one of ``KINDS``.
    """

    path: str
    mime: str
    size: int
    sha256: str
    name: str = ""
    kind: str = "document"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MediaRef:
        """Raises KeyError/TypeError/ValueError for a malformed dict."""
        return cls(path=str(d["path"]), mime=str(d["mime"]), size=int(d["size"]),
                   sha256=str(d["sha256"]), name=str(d.get("name") or ""),
                   kind=str(d.get("kind") or "document"))

    def label(self) -> str:
        """One line for the model: the name JSON-quoted (user-controlled data, never
        instructions), type, size and where the file is in the workspace."""
        return (f"[attachment: {self.kind} {json.dumps(self.name or self.path, ensure_ascii=False)}"
                f" {self.mime}, {human_size(self.size)}, saved at {self.path}]")


def human_size(n: int) -> str:
    """``1536`` -> ``"1.5 KB"`` (binary units, one decimal)."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
