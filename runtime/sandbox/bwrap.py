"""The bubblewrap sandbox (bwrap(1), Debian package ``bubblewrap``).

What a command sees: the system read-only (``/`` bound read-only), a private ``/tmp``,
empty ``/home``, ``/root`` and ``/run/user`` (all of ``/run`` without the network), the
gateway's state dir, home and the other agents' workspaces hidden (an empty directory in
their place), the config and env files and ``/etc/shadow``/``/etc/gshadow`` blanked, the
workspace
read-write at its own path (the file tools and ``apply_patch`` see the same files), a
fresh ``/proc`` of its own PID namespace and a minimal ``/dev``. Namespaces: user, IPC,
PID, UTS, cgroup, and network unless ``network: true`` (then only the host's network is
shared). All capabilities are dropped; ``--die-with-parent`` ends it with the gateway;
``prlimit`` sets the CPU time and address-space limits before bwrap starts.
"""

from __future__ import annotations

import functools
import shlex
import shutil
import subprocess
from pathlib import Path

HIDDEN_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
EMPTY_DIRS = ("/home", "/root", "/run/user", "/var/tmp")
SOCKET_DIRS = ("/run", "/var/run")
"""Emptied when the sandbox has no network: the host's Unix sockets live there."""


def bwrap_path() -> str | None:
    """The bwrap binary, or None when it is not installed."""
    return shutil.which("bwrap")


PROBE_HINT = ("under systemd, reinstall the unit with `tidegate service install` (it allows "
              "the mount and namespace calls bwrap needs when a sandbox is configured); "
              "elsewhere, unprivileged user namespaces may be off "
              "(sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces)")


@functools.cache
def probe(bwrap: str) -> str | None:
    """Run ``true`` in the namespaces the sandbox uses, once per process: None when it
    works, else why not (bwrap's own message and what to check). A seccomp filter or a
    kernel without unprivileged user namespaces would otherwise fail every command."""
    argv = [bwrap, "--die-with-parent", "--unshare-all", "--ro-bind", "/", "/",
            "--proc", "/proc", "--dev", "/dev", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not be run ({exc}); {PROBE_HINT}"
    if done.returncode == 0:
        return None
    said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0][:200]
    return f"bwrap cannot create its sandbox here ({said}); {PROBE_HINT}"


def bwrap_argv(bwrap: str, workspace: Path, hidden: list[Path], *, network: bool,
               cpu_seconds: int, memory_mb: int,
               hidden_files: list[Path] | None = None) -> list[str]:
    """The argv (prlimit + bwrap, ending in ``--``) that runs a program in the sandbox.
    ``hidden``: directories to hide (the state dir, the gateway user's home, the other
    agents' workspaces); ``hidden_files``: files to blank (the config file, the env
    file). bwrap applies mounts in order, so a hidden directory that contains the
    workspace is emptied before the workspace is bound back, and one inside the
    workspace (a workspace that contains the state dir) after it; a hidden directory
    equal to the workspace is not hidden (the config load refuses that layout for the
    state dir and the home). Without the network, ``/run`` (and ``/var/run``) is empty as
    well: the host's Unix sockets there (PostgreSQL, Docker, D-Bus, systemd) are out of
    reach, as are ``/tmp``'s (private) — sockets in the workspace stay reachable."""
    real = workspace.resolve()  # bound and compared resolved: a symlinked path is the
    ws = str(real)              # same place (and a symlink into a hidden dir still works)
    argv = [shutil.which("prlimit") or "prlimit", f"--cpu={cpu_seconds}",
            f"--as={memory_mb * 1024 * 1024}", "--core=0", "--", bwrap,
            "--die-with-parent", "--unshare-all", "--cap-drop", "ALL",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp"]
    if network:
        argv.append("--share-net")
    empty = [*EMPTY_DIRS, *(() if network else SOCKET_DIRS)]
    for d in empty:
        if Path(d).is_dir() and not Path(d).is_symlink():
            argv += ["--tmpfs", d]
    after: list[str] = []
    for d in hidden:
        if not d.is_dir() or d.resolve() == real:
            continue
        (argv if real.is_relative_to(d.resolve()) else after).extend(
            ["--tmpfs", str(d.resolve())])
    for f in HIDDEN_FILES:
        if Path(f).exists():
            argv += ["--ro-bind", "/dev/null", f]
    for f in hidden_files or []:
        if f.is_file():
            after += ["--ro-bind", "/dev/null", str(f)]
    argv += ["--bind", ws, ws, *after, "--chdir", ws, "--"]
    return argv


def wrap_command(argv: list[str], command: str) -> str:
    """Shell text that replaces the current shell with the sandboxed ``sh -c command``."""
    return "exec " + shlex.join([*argv, "/bin/sh", "-c", command])
