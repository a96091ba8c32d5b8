"""The Docker sandbox: the same contract as bubblewrap in a container — the workspace
mounted read-write at its own path, nothing else of the host, no network unless
``network: true``, a read-only root file system with a private ``/tmp``, all capabilities
dropped, CPU, memory and process limits — used when a Docker daemon is reachable
(``$DOCKER_HOST`` or ``/var/run/docker.sock``, as the ``docker`` client finds it).
Commands run as the gateway's own uid:gid (``--user``), so files they write in the
workspace stay the gateway's. The container is removed when the command ends (``--rm``).
Killing the ``docker`` client (a timeout, the process tool, a turn stopped) does not stop
its container, so every container is named (``tidegate-exec-<hex>``) and
:func:`remove_container` (``docker rm -f``) runs once its command is over, however it
ended.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import socket
from pathlib import Path
from urllib.parse import urlsplit

import structlog

log = structlog.get_logger(__name__)

DOCKER_SOCKET = Path("/var/run/docker.sock")
RM_TIMEOUT = 15.0  # seconds `docker rm -f` may take


def _daemon_address() -> tuple[int, object]:
    """(socket family, address) of the daemon: ``$DOCKER_HOST`` (``unix://`` or
    ``tcp://``), else :data:`DOCKER_SOCKET`."""
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("tcp://"):
        url = urlsplit(host)
        return socket.AF_INET, (url.hostname or "127.0.0.1", url.port or 2375)
    if host.startswith("unix://"):
        return socket.AF_UNIX, host.removeprefix("unix://")
    return socket.AF_UNIX, str(DOCKER_SOCKET)


def docker_reachable() -> str | None:
    """Why no Docker daemon can be used (None: it can): no ``docker`` client, or nothing
    answering at the daemon's address."""
    if shutil.which("docker") is None:
        return "the docker client is not installed"
    family, address = _daemon_address()
    try:
        with socket.socket(family) as s:
            s.settimeout(2.0)
            s.connect(address)  # type: ignore[arg-type]
    except OSError as exc:
        return f"no Docker daemon answers on {address} ({exc.strerror or exc})"
    return None


def docker_argv(workspace: Path, *, image: str, network: bool, cpu_seconds: int,
                memory_mb: int, max_processes: int, env: dict[str, str],
                name: str, hidden: list[Path] | None = None,
                hidden_files: list[Path] | None = None) -> list[str]:
    """The ``docker run`` argv (ending in the image) for one command in container
    ``name``. Only the workspace is mounted; ``hidden`` directories and ``hidden_files``
    that lie inside it (a workspace holding the state dir) are covered by an empty tmpfs
    or ``/dev/null`` (Docker mounts nested paths after their parents)."""
    ws = str(workspace)
    argv = ["docker", "run", "--rm", "-i", "--init", "--name", name,
            "--user", f"{os.getuid()}:{os.getgid()}", "--read-only", "--tmpfs", "/tmp",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--network", "bridge" if network else "none",
            "--memory", f"{memory_mb}m", "--pids-limit", str(max_processes),
            "--ulimit", f"cpu={cpu_seconds}", "-v", f"{ws}:{ws}", "-w", ws]
    real = workspace.resolve()
    for d in hidden or []:
        inside = d.resolve()
        if inside != real and inside.is_relative_to(real) and d.is_dir():
            argv += ["--tmpfs", str(workspace / inside.relative_to(real))]
    for f in hidden_files or []:
        inside = f.resolve()
        if inside.is_relative_to(real) and f.is_file():
            argv += ["-v", f"/dev/null:{workspace / inside.relative_to(real)}:ro"]
    for k, v in env.items():
        argv += ["-e", f"{k}={v}"]
    return [*argv, image]


def wrap_command(argv: list[str], command: str) -> str:
    return "exec " + shlex.join([*argv, "/bin/sh", "-c", command])


async def remove_container(name: str) -> None:
    """``docker rm -f name``: the container of a command that is over (already gone after
    a normal end: then nothing happens). A failure is logged, never raised."""
    try:
        proc = await asyncio.create_subprocess_exec(
            "docker", "rm", "-f", name, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        async with asyncio.timeout(RM_TIMEOUT):  # the daemon's time, no clock to drive
            _, err = await proc.communicate()
    except (OSError, TimeoutError) as exc:
        log.warning("sandbox_container_left", container=name, error=str(exc))
        return
    said = err.decode(errors="replace").strip()
    if proc.returncode and "no such container" not in said.lower():
        log.warning("sandbox_container_left", container=name, error=said[:300])
