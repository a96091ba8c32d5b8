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
ended. A gateway killed outright (``kill -9``, a power cut) runs neither, so every
container also carries the label ``io.tidegate.owner=<id>`` (:func:`owner_id`: this
host and state dir), and the next start removes the ones left with its own id
(:func:`remove_stale_containers`) — only its own: the state-dir lock means no live
gateway has that id.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shlex
import shutil
import socket
from pathlib import Path
from urllib.parse import urlsplit

import structlog

log = structlog.get_logger(__name__)

DOCKER_SOCKET = Path("/var/run/docker.sock")
RM_TIMEOUT = 15.0  # seconds `docker rm -f` (or `docker ps`) may take
OWNER_LABEL = "io.tidegate.owner"


def owner_id(state_dir: Path) -> str:
    """The ``io.tidegate.owner`` label value of one gateway's containers: 16 hex digits
    of a hash of this host's name and the resolved state dir (a daemon shared by two
    hosts with the same state dir path tells them apart)."""
    key = f"{socket.gethostname()}\0{state_dir.resolve()}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


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
                name: str, owner: str, hidden: list[Path] | None = None,
                hidden_files: list[Path] | None = None) -> list[str]:
    """The ``docker run`` argv (ending in the image) for one command in container
    ``name``, labelled ``io.tidegate.owner=<owner>`` (:func:`owner_id`) and removed when
    it ends (``--rm``). Only the workspace is mounted; ``hidden`` directories and ``hidden_files``
    that lie inside it (a workspace holding the state dir) are covered by an empty tmpfs
    or ``/dev/null`` (Docker mounts nested paths after their parents)."""
    ws = str(workspace)
    argv = ["docker", "run", "--rm", "-i", "--init", "--name", name,
            "--label", f"{OWNER_LABEL}={owner}",
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


async def _docker(*args: str) -> tuple[int | None, str, str]:
    """``(returncode, stdout, stderr)`` of ``docker *args`` within :data:`RM_TIMEOUT`
    (the daemon's time, no clock to drive). Raises OSError or TimeoutError."""
    proc = await asyncio.create_subprocess_exec(
        "docker", *args, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(RM_TIMEOUT):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return (proc.returncode, out.decode(errors="replace"),
            err.decode(errors="replace").strip())


async def remove_stale_containers(owner: str) -> list[str]:
    """Remove (``docker rm -f``) every container, running or not, labelled
    ``io.tidegate.owner=<owner>``: at start, the ones a killed gateway with this state
    dir left. Returns their ids; a failure is logged (``sandbox_containers_left``),
    never raised."""
    try:
        rc, out, err = await _docker("ps", "-aq", "--filter", f"label={OWNER_LABEL}={owner}")
        ids = out.split()
        if rc == 0 and ids:
            rc, _, err = await _docker("rm", "-f", *ids)
    except (OSError, TimeoutError) as exc:
        rc, ids, err = None, [], str(exc) or type(exc).__name__
    if rc != 0:
        log.warning("sandbox_containers_left", owner=owner, error=err[:300])
        return []
    if ids:
        log.warning("sandbox_stale_containers_removed", owner=owner, containers=ids,
                    reason="left by a gateway that did not stop cleanly")
    return ids


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
