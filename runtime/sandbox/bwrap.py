"""The bubblewrap sandbox (bwrap(1), Debian package ``bubblewrap``).

What a command sees: the system read-only (``/`` bound read-only), a private ``/tmp``,
empty ``/home``, ``/root`` and ``/run/user``, the gateway's state dir hidden (an empty
directory in its place) and ``/etc/shadow``/``/etc/gshadow`` blanked, the workspace
read-write at its own path (the file tools and ``apply_patch`` see the same files), a
fresh ``/proc`` of its own PID namespace and a minimal ``/dev``. Namespaces: user, IPC,
PID, UTS, cgroup, and network unless ``network: true`` (then only the host's network is
shared). All capabilities are dropped; ``--die-with-parent`` ends it with the gateway;
``prlimit`` sets the CPU time and address-space limits before bwrap starts.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

HIDDEN_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
EMPTY_DIRS = ("/home", "/root", "/run/user", "/var/tmp")


def bwrap_path() -> str | None:
    """The bwrap binary, or None when it is not installed."""
    return shutil.which("bwrap")


def bwrap_argv(bwrap: str, workspace: Path, hidden: list[Path], *, network: bool,
               cpu_seconds: int, memory_mb: int) -> list[str]:
    """The argv (prlimit + bwrap, ending in ``--``) that runs a program in the sandbox.
    ``hidden``: directories to hide (the state dir, the gateway user's home)."""
    ws = str(workspace)
    argv = [shutil.which("prlimit") or "prlimit", f"--cpu={cpu_seconds}",
            f"--as={memory_mb * 1024 * 1024}", "--core=0", "--", bwrap,
            "--die-with-parent", "--unshare-all", "--cap-drop", "ALL",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp"]
    if network:
        argv.append("--share-net")
    for d in EMPTY_DIRS:
        if Path(d).is_dir():
            argv += ["--tmpfs", d]
    for d in hidden:
        if d.is_dir():
            argv += ["--tmpfs", str(d)]
    for f in HIDDEN_FILES:
        if Path(f).exists():
            argv += ["--ro-bind", "/dev/null", f]
    argv += ["--bind", ws, ws, "--chdir", ws, "--"]
    return argv


def wrap_command(argv: list[str], command: str) -> str:
    """Shell text that replaces the current shell with the sandboxed ``sh -c command``."""
    return "exec " + shlex.join([*argv, "/bin/sh", "-c", command])
