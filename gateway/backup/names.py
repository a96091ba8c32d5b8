"""Default names of backup archives: ``tidegate-backup-<UTC time>.tar.gz`` (scheduled;
rotation may delete them), ``...-manual.tar.gz`` (made by hand), ``-1``, ``-2`` ... added
when a name is taken (two backups in one second, or at once)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

NAME_PREFIX = "tidegate-backup-"
SUFFIX = ".tar.gz"
MANUAL = "-manual"
# the names rotation may delete: scheduled backups (hand-made ones end in -manual)
SCHEDULED_NAME = re.compile(r"tidegate-backup-\d{8}T\d{6}Z(?:-\d+)?\.tar\.gz")


def default_name(now: float, *, scheduled: bool = True) -> str:
    """``tidegate-backup-YYYYmmddTHHMMSSZ.tar.gz`` (UTC; sorts by time) for a scheduled
    backup, ``tidegate-backup-YYYYmmddTHHMMSSZ-manual.tar.gz`` for one made by hand
    (rotation never deletes those)."""
    stamp = NAME_PREFIX + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return stamp + ("" if scheduled else MANUAL) + SUFFIX


def free_path(directory: Path, now: float, *, scheduled: bool = True) -> Path:
    """A not yet existing default-named file in ``directory`` (``-1``, ``-2`` ... when a
    backup of the same second exists)."""
    base = directory / default_name(now, scheduled=scheduled)
    path, n = base, 0
    while os.path.lexists(path):  # a dangling symlink is taken too
        n += 1
        path = numbered(base, n)
    return path


def numbered(path: Path, n: int) -> Path:
    """``path`` with ``-<n>`` before ``.tar.gz`` (``n`` 0: ``path`` itself)."""
    return path.with_name(path.name.removesuffix(SUFFIX) + f"-{n}{SUFFIX}") if n else path
