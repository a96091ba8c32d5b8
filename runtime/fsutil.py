"""Atomic file replacement, the one implementation every store uses (handbook: "every
write that matters is atomic or append-only")."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Replace ``path`` with ``data``: a temp file in the same directory, fsync, rename,
    fsync of the directory (``durable=False`` skips the two fsyncs: still never torn by a
    process crash, only not guaranteed across power loss). Creates missing parents.
    Raises OSError; ``path`` is then unchanged and no temp file is left behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
