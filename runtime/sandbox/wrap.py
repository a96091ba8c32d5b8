"""The sandbox one exec command runs in: the backend's wrapping of the command text, the
limits, and the start-up check that the configured backend exists (never a silent
fallback to the host)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from runtime.sandbox import bwrap, docker, limits
from runtime.sandbox.config import SandboxSettings


def sandboxed(settings: SandboxSettings, agent_id: str, session_key: str, *,
              stranger: bool = False) -> bool:
    """Whether commands of ``session_key`` run in the sandbox (``mode``: all, or
    non-main for every session but ``agent:<agent>:main``, and for every turn that acts
    for a ``stranger``: a sender who is not an owner; with ``session.dm_scope: main``
    every DM lands in the main session)."""
    return settings.mode == "all" or (settings.mode == "non-main" and (
        stranger or session_key != f"agent:{agent_id}:main"))


def unavailable(settings: SandboxSettings) -> str | None:
    """Why the configured backend cannot run here (None: it can)."""
    if settings.backend == "bwrap":
        path = bwrap.bwrap_path()
        if path is None:
            return ("bwrap is not installed (Debian/Ubuntu: apt install bubblewrap); "
                    "commands never fall back to the host")
        why = bwrap.probe(path)
        return f"{why}; commands never fall back to the host" if why else None
    why = docker.docker_reachable()
    return f"{why}; commands never fall back to the host" if why else None


@dataclass(frozen=True)
class Sandbox:
    """A sandbox for commands of one agent. ``hidden``: host directories the command
    must not see (the state dir, the gateway user's home, other agents' workspaces);
    ``hidden_files``: host files it must not read (the config file, the env file);
    ``owner``: the label value of its Docker containers (docker.py ``owner_id``)."""

    settings: SandboxSettings
    hidden: tuple[Path, ...] = ()
    hidden_files: tuple[Path, ...] = ()
    owner: str = ""

    def prepare(self, command: str, workspace: Path,
                env: dict[str, str]) -> tuple[str, Leftovers]:
        """``(shell text, leftovers)``: the text runs ``command`` inside the sandbox
        (joining a fresh pids cgroup first when one can be made); :func:`clean_up` the
        leftovers once the command is over. Raises RuntimeError when the backend
        vanished since start."""
        s = self.settings
        why = unavailable(s)
        if why:
            raise RuntimeError(f"sandbox ({s.backend}) unavailable: {why}")
        if s.backend == "docker":
            name = f"tidegate-exec-{secrets.token_hex(6)}"
            argv = docker.docker_argv(workspace, image=s.image, network=s.network,
                                      cpu_seconds=s.cpu_seconds, memory_mb=s.memory_mb,
                                      max_processes=s.max_processes,
                                      env={k: v for k, v in env.items() if k != "PATH"},
                                      name=name, owner=self.owner,
                                      hidden=list(self.hidden),
                                      hidden_files=list(self.hidden_files))
            return docker.wrap_command(argv, command), Leftovers(container=name)
        cgroup = limits.new_cgroup(s.max_processes)
        argv = bwrap.bwrap_argv(bwrap.bwrap_path() or "bwrap", workspace, list(self.hidden),
                                network=s.network, cpu_seconds=s.cpu_seconds,
                                memory_mb=s.memory_mb,
                                hidden_files=list(self.hidden_files))
        text = limits.join_text(cgroup)
        if cgroup is None:  # RLIMIT_NPROC instead (not applied to root by the kernel)
            argv.insert(1, f"--nproc={s.max_processes}")
        return text + bwrap.wrap_command(argv, command), Leftovers(cgroup=cgroup)


@dataclass(frozen=True)
class Leftovers:
    """What a sandboxed command leaves to remove once it is over: its pids ``cgroup``
    (bwrap) or its ``container`` (docker: killing the client does not stop it)."""

    cgroup: Path | None = None
    container: str | None = None


async def clean_up(left: Leftovers | None) -> None:
    """Remove what a finished (or killed) sandboxed command left; never raises."""
    if left is None:
        return
    if left.cgroup is not None:
        await limits.remove_soon(left.cgroup)
    if left.container is not None:
        await docker.remove_container(left.container)
