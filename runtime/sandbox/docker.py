"""The Docker sandbox: the same contract as bubblewrap in a container — the workspace
mounted read-write at its own path, nothing else of the host, no network unless
``network: true``, a read-only root file system with a private ``/tmp``, all capabilities
dropped, CPU, memory and process limits — used when a Docker daemon is reachable. The
container is removed when the command ends (``--rm``) and the ``docker`` client is the
process the gateway kills on timeout (``--init`` forwards the signal).
"""

from __future__ import annotations

import shlex
import shutil
import socket
from pathlib import Path

DOCKER_SOCKET = Path("/var/run/docker.sock")


def docker_reachable() -> str | None:
    """Why no Docker daemon can be used (None: it can): no ``docker`` client, or nothing
    answering on the daemon socket."""
    if shutil.which("docker") is None:
        return "the docker client is not installed"
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2.0)
            s.connect(str(DOCKER_SOCKET))
    except OSError as exc:
        return f"no Docker daemon answers on {DOCKER_SOCKET} ({exc.strerror or exc})"
    return None


def docker_argv(workspace: Path, *, image: str, network: bool, cpu_seconds: int,
                memory_mb: int, max_processes: int, env: dict[str, str]) -> list[str]:
    """The ``docker run`` argv (ending in the image) for one command."""
    ws = str(workspace)
    argv = ["docker", "run", "--rm", "-i", "--init", "--read-only", "--tmpfs", "/tmp",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--network", "bridge" if network else "none",
            "--memory", f"{memory_mb}m", "--pids-limit", str(max_processes),
            "--ulimit", f"cpu={cpu_seconds}", "-v", f"{ws}:{ws}", "-w", ws]
    for k, v in env.items():
        argv += ["-e", f"{k}={v}"]
    return [*argv, image]


def wrap_command(argv: list[str], command: str) -> str:
    return "exec " + shlex.join([*argv, "/bin/sh", "-c", command])
