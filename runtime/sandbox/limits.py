"""Process-count limits for sandboxed commands: a pids cgroup per command where one can be
made (cgroup v1 ``/sys/fs/cgroup/pids``, or a writable cgroup v2 subtree with the pids
controller), else ``RLIMIT_NPROC`` (which the kernel does not apply to root: a root
gateway without a pids cgroup has no process limit, and says so at start).

The command's shell joins its cgroup before it starts the sandbox (``join_text``); the
cgroup is removed when the command ended (:func:`remove`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

V1 = Path("/sys/fs/cgroup/pids")


def _v2_base() -> Path | None:
    try:
        line = next(x for x in Path("/proc/self/cgroup").read_text().splitlines()
                    if x.startswith("0::"))
    except (OSError, StopIteration):
        return None
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        base = root / line[3:].lstrip("/")
        if (root / "cgroup.controllers").exists() and "pids" in _read(
                base / "cgroup.subtree_control") and os.access(base, os.W_OK):
            return base
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def pids_base() -> Path | None:
    """Where per-command pids cgroups can be made, or None."""
    if V1.is_dir() and os.access(V1, os.W_OK):
        return V1
    return _v2_base()


def new_cgroup(max_processes: int) -> Path | None:
    """A fresh pids cgroup limited to ``max_processes``, or None when none can be made."""
    base = pids_base()
    if base is None:
        return None
    path = base / f"tidegate-exec-{secrets.token_hex(6)}"
    try:
        path.mkdir()
        (path / "pids.max").write_text(str(max_processes))
    except OSError as exc:
        log.warning("sandbox_cgroup_failed", path=str(path), error=str(exc))
        remove(path)
        return None
    return path


def join_text(cgroup: Path | None) -> str:
    """Shell text that moves the current shell into ``cgroup`` (nothing when None)."""
    return f"echo $$ > {cgroup / 'cgroup.procs'} || exit 126\n" if cgroup else ""


def remove(cgroup: Path | None) -> bool:
    """Remove a command's cgroup; False while processes are still in it (the kernel
    reaps a killed PID namespace asynchronously)."""
    if cgroup is None:
        return True
    try:
        cgroup.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


async def remove_soon(cgroup: Path | None, *, tries: int = 60, every: float = 0.05) -> None:
    """:func:`remove`, retried while the last processes of a killed command exit (up to
    ``tries * every`` seconds of wall time); a cgroup still busy then is logged."""
    import asyncio
    for _ in range(tries):
        if remove(cgroup):
            return
        await asyncio.sleep(every)  # the kernel, not a schedule: no clock to drive
    log.warning("sandbox_cgroup_left", path=str(cgroup))
