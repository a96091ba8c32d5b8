"""The exec sandbox (docs/exec.md "Sandbox"): the real gateway in-process, the fake model
issuing exec calls, the commands run in bubblewrap. Inside: the workspace is writable and
the file tools see the same files, while /etc/shadow, the state dir, ``~``, a TCP
connect to a port on the host and a fork bomb all fail."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket

import pytest

from gateway.config.load import ConfigError, parse_config
from runtime.sandbox import limits
from runtime.sandbox.docker import docker_reachable
from tests.helpers import base_config, running_gateway

pytestmark = pytest.mark.timeout(30)

BWRAP = shutil.which("bwrap")
needs_bwrap = pytest.mark.skipif(BWRAP is None, reason="bubblewrap (bwrap) is not installed")
KEY = "agent:main:cli:dm:local"


def config(tmp_path, model, **sandbox) -> dict:
    cfg = base_config(tmp_path / "state", model.base_url)
    cfg["agents"]["defaults"]["sandbox"] = {"mode": "non-main", "backend": "bwrap",
                                            "max_processes": 64, **sandbox}
    cfg["agents"]["defaults"]["exec"] = {"timeout": "1.5s"}
    return cfg


def bomb_processes() -> list[str]:
    """Processes whose command line holds the fork bomb (exact text, no regex)."""
    found = []
    for proc in os.listdir("/proc"):
        try:
            with open(f"/proc/{proc}/cmdline", "rb") as fh:
                if b"b() { b | b & }" in fh.read():
                    found.append(proc)
        except OSError:
            continue
    return found


def results(model) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for r in model.requests
            for m in (r.json or {}).get("messages", []) if m["role"] == "tool"}


@needs_bwrap
async def test_bwrap_sandbox_keeps_the_workspace_and_nothing_else(tmp_path, model):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    state = tmp_path / "state"
    base = limits.pids_base()
    before = set(base.glob("tidegate-exec-*")) if base else set()
    async with running_gateway(config(tmp_path, model)) as gw:
        ws = gw.config.workspace_for("main")
        (state / "tidegate.env").write_text("OPENAI_API_KEY=sk-in-the-state-dir\n")
        probe = (f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", "
                 f"{port}), 2)' && echo CONNECTED")
        calls = {
            "ws": "echo made-inside > inside.txt && pwd",
            "shadow": "cat /etc/shadow && echo READ-SHADOW",
            "state": f"ls -A {state} && cat {state}/tidegate.env",
            "home": f"ls -A {os.path.expanduser('~')} | head -3; echo HOME-LISTED",
            "net": probe,
            "pid": "ps -eo pid= | wc -l",
            "bomb": "b() { b | b & }; b; sleep 5",
        }
        model.script_tool_calls([{"id": k, "name": "exec", "arguments": {"command": v}}
                                 for k, v in calls.items()]
                                + [{"id": "read", "name": "read",
                                    "arguments": {"path": "inside.txt"}}])
        model.script_text("checked")
        assert (await gw.local.send("probe", session_key=KEY)).text == "checked"
        # the owner's main session runs on the host
        model.script_tool_call("exec", {"command": f"ls {state}"}, call_id="main")
        model.script_text("host")
        assert (await gw.local.send("host", session_key="agent:main:main")).text == "host"
    listener.close()
    out = results(model)
    assert out["ws"].startswith("[exit code 0]") and str(ws) in out["ws"]
    assert (ws / "inside.txt").read_text() == "made-inside\n"
    assert "made-inside" in out["read"]  # the file tools see the same workspace
    assert "READ-SHADOW" not in out["shadow"] and "root:" not in out["shadow"]
    assert "sk-in-the-state-dir" not in out["state"]
    assert "No such file or directory" in out["state"], out["state"]
    home_listing = out["home"].split("]", 1)[1].replace("HOME-LISTED", "").split()
    assert home_listing == []
    assert "CONNECTED" not in out["net"] and "refused" in out["net"].lower()
    assert int(out["pid"].split()[-1]) <= 4  # its own PID namespace: no host processes
    assert out["bomb"].startswith("[timed out after 1.5s (killed)]")
    assert "fork" in out["bomb"].lower()  # it hit the process limit
    assert "tidegate.env" in out["main"]
    assert bomb_processes() == []  # the PID namespace died with the command
    assert base is None or set(base.glob("tidegate-exec-*")) <= before  # cgroups removed


def test_missing_bwrap_is_a_start_up_error_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on this PATH
    cfg = base_config(tmp_path / "state")
    cfg["agents"] = {"defaults": {"sandbox": {"mode": "all"}}}
    with pytest.raises(ConfigError) as err:
        parse_config(cfg, "test", env={})
    [problem] = err.value.problems
    assert problem.startswith("agents.defaults.sandbox.backend: bwrap: bwrap is not "
                              "installed")
    assert "never fall back to the host" in problem


@pytest.mark.skipif(docker_reachable() is not None,
                    reason=f"no Docker daemon here: {docker_reachable()}")
async def test_docker_sandbox_same_contract(tmp_path, model):
    async with running_gateway(config(tmp_path, model, backend="docker")) as gw:
        ws = gw.config.workspace_for("main")
        model.script_tool_calls([
            {"id": "ws", "name": "exec", "arguments": {"command": "echo d > d.txt"}},
            {"id": "state", "name": "exec",
             "arguments": {"command": f"ls {tmp_path / 'state'} && echo LISTED"}}])
        model.script_text("ok")
        await asyncio.wait_for(gw.local.send("go", session_key=KEY), 25)
    assert (ws / "d.txt").read_text() == "d\n"
    assert "LISTED" not in results(model)["state"]


def test_a_root_gateway_without_a_pids_cgroup_warns_there_is_no_process_limit(
        tmp_path, monkeypatch):
    from structlog.testing import capture_logs

    from gateway.tools.services import warn_sandbox_limits
    cfg = base_config(tmp_path / "state")
    cfg["agents"] = {"defaults": {"sandbox": {"mode": "all"}}}
    loaded = parse_config(cfg, "test", env={}) if BWRAP else None
    if loaded is None or os.geteuid() != 0:
        pytest.skip("needs bwrap and a root gateway")
    monkeypatch.setattr(limits, "V1", tmp_path / "no-cgroup-mount")  # no v1 pids mount
    if limits.pids_base() is not None:
        pytest.skip("a writable cgroup v2 pids subtree exists here")
    with capture_logs() as logs:
        assert "no process limit" in warn_sandbox_limits(loaded.config)
    assert [r["event"] for r in logs] == ["sandbox_no_process_limit"]
