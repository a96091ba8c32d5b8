"""The Docker sandbox's containers never outlive the gateway that made them (docs/exec.md
"Sandbox"): each one is ``--rm``, labelled with its gateway's owner id (this host and
state dir), and a gateway killed with ``kill -9`` has the containers it left removed by
its next start — only those, never another gateway's. No Docker daemon here, so a stand-in
client (tests/fakes/fake_docker.py) keeps the "containers"; the test of the real contract
in a real container is in test_exec_sandbox.py and runs where a daemon is reachable."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from runtime.sandbox.docker import OWNER_LABEL, docker_argv, docker_reachable, owner_id
from tests.channel_harness import until
from tests.fakes.fake_docker import FakeDocker
from tests.helpers import GatewayProcess, base_config, running_gateway

pytestmark = pytest.mark.timeout(60)


def test_the_docker_run_argv_is_removed_labelled_offline_and_limited(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    argv = docker_argv(ws, image="debian:stable-slim", network=False, cpu_seconds=7,
                       memory_mb=96, max_processes=12, env={"LANG": "C.UTF-8"},
                       name="tidegate-exec-ab12", owner="0123456789abcdef")
    assert argv == [
        "docker", "run", "--rm", "-i", "--init", "--name", "tidegate-exec-ab12",
        "--label", "io.tidegate.owner=0123456789abcdef",
        "--user", f"{os.getuid()}:{os.getgid()}", "--read-only", "--tmpfs", "/tmp",
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--network", "none",
        "--memory", "96m", "--pids-limit", "12", "--ulimit", "cpu=7",
        "-v", f"{ws}:{ws}", "-w", str(ws), "-e", "LANG=C.UTF-8", "debian:stable-slim"]
    online = docker_argv(ws, image="img", network=True, cpu_seconds=1, memory_mb=16,
                         max_processes=4, env={}, name="n", owner="o")
    assert online[online.index("--network") + 1] == "bridge"


def test_the_owner_id_is_the_host_and_the_resolved_state_dir(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "state")
    mine = owner_id(tmp_path / "state")
    assert len(mine) == 16 and int(mine, 16) >= 0
    assert owner_id(tmp_path / "link") == mine  # the same dir named another way
    assert owner_id(tmp_path / "other") != mine
    assert socket.gethostname()  # part of the hash: two hosts sharing a daemon differ


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a killed orphan may stay a zombie until init reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def config(tmp_path: Path, model_url: str) -> dict:
    cfg = base_config(tmp_path / "state", model_url)
    cfg["agents"]["defaults"]["sandbox"] = {"mode": "all", "backend": "docker"}
    cfg["agents"]["defaults"]["exec"] = {"timeout": "30s"}
    return cfg


async def test_containers_left_by_a_gateway_killed_with_kill9_are_removed_at_the_next_start(
        tmp_path, model, monkeypatch):
    docker = FakeDocker()
    for k, v in docker.env().items():
        monkeypatch.setenv(k, v)
    cfg = config(tmp_path, model.base_url)
    mine = owner_id(tmp_path / "state")
    docker.add("someone-elses", {OWNER_LABEL: owner_id(tmp_path / "another-state")})
    try:
        gwp = GatewayProcess(tmp_path, cfg)
        await asyncio.to_thread(gwp.start)
        model.script_tool_call("exec", {"command": "sleep 100"}, call_id="long")
        model.script_text("never seen")
        asking = asyncio.create_task(asyncio.to_thread(
            gwp.cli, "agent", "-m", "go", check=False, timeout=30))
        await until(lambda: [n for n, c in docker.containers().items()
                             if c["labels"].get(OWNER_LABEL) == mine],
                    what="the command's container running", timeout=20)
        [(name, run)] = [(n, c) for n, c in docker.containers().items()
                         if c["labels"].get(OWNER_LABEL) == mine]
        assert name.startswith("tidegate-exec-")
        [run_argv] = [c for c in docker.calls() if c[:1] == ["run"]]
        assert "--rm" in run_argv and f"{OWNER_LABEL}={mine}" in run_argv
        gwp.kill9()  # no chance to remove it: the container stays
        await asyncio.gather(asking, return_exceptions=True)  # its gateway is gone
        assert name in docker.containers()
        assert alive(run["pid"])  # still "running"

        async with running_gateway(cfg):  # the next start removes it, and only it
            assert set(docker.containers()) == {"someone-elses"}
        await until(lambda: not alive(run["pid"]), what="the container's process gone")
        assert ["ps", "-aq", "--filter", f"label={OWNER_LABEL}={mine}"] in docker.calls()
        assert ["rm", "-f", name] in docker.calls()
    finally:
        docker.close()


async def test_a_start_without_a_docker_sandbox_asks_docker_nothing(tmp_path, model,
                                                                    monkeypatch):
    docker = FakeDocker()
    for k, v in docker.env().items():
        monkeypatch.setenv(k, v)
    try:
        async with running_gateway(base_config(tmp_path / "state", model.base_url)):
            pass
        assert docker.calls() == []
    finally:
        docker.close()


@pytest.mark.skipif(docker_reachable() is not None,
                    reason=f"no Docker daemon reachable: {docker_reachable()}")
async def test_a_real_daemon_removes_the_labelled_leftovers_at_start(tmp_path, model):
    """Where a daemon runs: a labelled container started by hand (as a killed gateway
    leaves one) is gone once the gateway has started."""
    import subprocess

    def docker(*args: str) -> str:
        return subprocess.run(["docker", *args], capture_output=True, text=True,
                              timeout=60).stdout
    cfg = config(tmp_path, model.base_url)
    (tmp_path / "state").mkdir()
    mine = owner_id(tmp_path / "state")
    name = f"tidegate-exec-leftover-{os.getpid()}"
    await asyncio.to_thread(docker, "run", "-d", "--rm", "--name", name, "--label",
                            f"{OWNER_LABEL}={mine}", "debian:stable-slim", "sleep", "60")
    try:
        assert (await asyncio.to_thread(docker, "ps", "-q", "--filter", f"name={name}"))
        async with running_gateway(cfg):
            left = await asyncio.to_thread(docker, "ps", "-aq", "--filter", f"name={name}")
        assert left.strip() == ""
    finally:
        await asyncio.to_thread(docker, "rm", "-f", name)
