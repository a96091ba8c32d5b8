"""Embedded whole-document store: one file, replaced atomically (``runtime.fsutil``)."""

from __future__ import annotations

from pathlib import Path

from runtime.fsutil import atomic_write
from runtime.state_files import keep_aside


class DocumentFile:
    """The :class:`runtime.storage.documents.DocumentRecords` backend on one file.
    ``durable=False`` skips the fsyncs (state that is cheap to lose on a power cut)."""

    def __init__(self, path: Path, *, durable: bool = True) -> None:
        self.path = Path(path)
        self.durable = durable

    def read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def write(self, data: bytes) -> None:
        atomic_write(self.path, data, durable=self.durable)

    def keep_aside(self) -> str | None:
        copy = keep_aside(self.path) if self.path.is_file() else None
        return copy.name if copy is not None else None
