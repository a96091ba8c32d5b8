"""The staging directory of a running ``backup create`` (``.tidegate-backup-XXXX`` beside
the destination), and the clean-up of those a killed create left behind.

A create holds an exclusive ``flock`` on ``<staging>/.lock`` while it runs; the next
create removes every staging dir whose lock it can take (its create is gone: killed,
crashed) and, for one without a lock file, only when it is older than
:data:`GRACE_S` (a create that has just made its dir and not yet locked it is spared).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)
PREFIX = ".tidegate-backup-"
LOCK = ".lock"
GRACE_S = 60.0


@contextlib.contextmanager
def staging(parent: Path) -> Iterator[Path]:
    """A new locked staging dir in ``parent`` (stale ones removed first), removed on
    exit. Raises OSError."""
    clean_stale(parent)
    tmp = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    fd = os.open(tmp / LOCK, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)


def clean_stale(parent: Path, now: float | None = None) -> list[Path]:
    """Remove the staging dirs in ``parent`` no running create holds; returns them."""
    now = time.time() if now is None else now
    removed = []
    for d in sorted(parent.glob(PREFIX + "*")) if parent.is_dir() else []:
        if not d.is_dir() or d.is_symlink() or not _stale(d, now):
            continue
        shutil.rmtree(d, ignore_errors=True)
        log.info("backup_staging_removed", path=str(d))
        removed.append(d)
    return removed


def _stale(d: Path, now: float) -> bool:
    try:
        fd = os.open(d / LOCK, os.O_RDONLY)
    except FileNotFoundError:
        try:
            return now - d.stat().st_mtime > GRACE_S
        except OSError:
            return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # a running create holds it
    finally:
        os.close(fd)
    return True
