"""Writing one archive member to disk during ``backup verify``/``restore``, hashing it
on the way, and telling a failed write (the target's problem: a full disk, a file size
limit) from a failed read (the archive's problem)."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path
from typing import Any


class TargetUnwritable(Exception):
    """Writing the unpacked files failed (a full disk, a file size limit): the target is
    the problem, not the archive. ``path``: the file being written; ``reason``: why."""

    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(f"{path}: {exc.strerror or exc}")
        self.path, self.reason = path, exc.strerror or str(exc)


def extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path,
                    want: dict[str, Any]) -> str | None:
    """Write ``member`` to ``target`` hashing it; the problem, or None. Raises
    TargetUnwritable when a write fails (a read that fails is the archive's problem)."""
    h, size = hashlib.sha256(), 0
    src = tar.extractfile(member)
    try:
        _mkdirs(target.parent)
        fh = os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")
    except OSError as exc:
        raise TargetUnwritable(target, exc) from None
    try:
        for chunk in iter(lambda: src.read(1 << 20), b""):  # type: ignore[union-attr]
            h.update(chunk)
            size += len(chunk)
            try:
                fh.write(chunk)
            except OSError as exc:
                raise TargetUnwritable(target, exc) from None
    finally:
        try:
            fh.close()  # flushes: the last write can fail here
        except OSError as exc:
            raise TargetUnwritable(target, exc) from None
    if size != want["size"]:
        return f"{want['path']}: size {size} bytes, the manifest says {want['size']}"
    if h.hexdigest() != want["sha256"]:
        return (f"{want['path']}: SHA-256 {h.hexdigest()[:16]}… does not match the "
                f"manifest's {want['sha256'][:16]}…")
    return None


def _mkdirs(path: Path) -> None:
    """``path`` and every missing parent, each 0700 (a restore then sets the modes of
    the manifest's ``dirs``)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)


def below(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when it is under it (a COPY file may not be)."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)
