"""The exec sandbox (docs/exec.md "Sandbox"): the real gateway in-process, the fake model
issuing exec calls, the commands run in bubblewrap. Inside: the workspace is writable and
the file tools and apply_patch see the same files, while /etc/shadow, the state dir,
``~``, the host's /tmp, a TCP connect to a port on the host (unless ``network: true``),
memory beyond ``memory_mb`` and a fork bomb all fail."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from gateway.config.load import ConfigError, parse_config
from runtime.sandbox import limits
from runtime.sandbox.docker import docker_reachable
from tests.channel_harness import until
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
    marker = Path(tempfile.mkdtemp(prefix="tidegate-host-tmp-"))  # in the host's /tmp
    cfg = config(tmp_path, model)
    cfg["agents"]["list"] = [{"id": "main"},
                             {"id": "net", "sandbox": {"mode": "all", "network": True}}]
    async with running_gateway(cfg) as gw:
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
        calls.update({
            "tmp": f"ls -A /tmp; echo in-sandbox > /tmp/{marker.name}-inside",
            "mem": "python3 -c 'bytearray(2 * 1024 ** 3)' || echo ALLOC-REFUSED",
            "cpu": "ulimit -t",
        })
        patch = ("--- a/inside.txt\n+++ b/inside.txt\n@@ -1 +1 @@\n-made-inside\n"
                 "+patched-on-the-host\n")
        model.script_tool_calls([{"id": k, "name": "exec", "arguments": {"command": v}}
                                 for k, v in calls.items()]
                                + [{"id": "read", "name": "read",
                                    "arguments": {"path": "inside.txt"}},
                                   {"id": "patch", "name": "apply_patch",
                                    "arguments": {"patch": patch}},
                                   {"id": "cat", "name": "exec",
                                    "arguments": {"command": "cat inside.txt"}}])
        model.script_text("checked")
        assert (await gw.local.send("probe", session_key=KEY)).text == "checked"
        # an agent with network: true reaches the same port
        model.script_tool_call("exec", {"command": probe}, call_id="net-on")
        model.script_text("online")
        assert (await gw.local.send("net", session_key="agent:net:cli:dm:local")
                ).text == "online"
        # the owner's main session runs on the host
        model.script_tool_call("exec", {"command": f"ls {state}"}, call_id="main")
        model.script_text("host")
        assert (await gw.local.send("host", session_key="agent:main:main")).text == "host"
    listener.close()
    out = results(model)
    inside_tmp = Path(f"/tmp/{marker.name}-inside")
    leaked = inside_tmp.exists()
    inside_tmp.unlink(missing_ok=True)
    marker.rmdir()
    # a private /tmp: the host's is not there, and what is written there stays inside
    assert marker.name not in out["tmp"] and not leaked
    assert "ALLOC-REFUSED" in out["mem"] and "MemoryError" in out["mem"]  # memory_mb
    assert out["cpu"].split()[-1] == "60"  # cpu_seconds: the CPU-time limit inside
    # apply_patch (on the host) and the sandbox see the same workspace file
    assert out["patch"] == "patched inside.txt", out["patch"]
    assert "patched-on-the-host" in out["cat"]
    assert "CONNECTED" in out["net-on"], out["net-on"]
    assert out["ws"].startswith("[exit code 0]") and str(ws) in out["ws"]
    assert (ws / "inside.txt").read_text() == "patched-on-the-host\n"  # made, then patched
    assert "made-inside" in out["read"]  # the file tools see the same workspace
    assert "READ-SHADOW" not in out["shadow"] and "root:" not in out["shadow"]
    assert "sk-in-the-state-dir" not in out["state"]
    assert "No such file or directory" in out["state"], out["state"]
    home_listing = out["home"].split("]", 1)[1].replace("HOME-LISTED", "").split()
    assert home_listing == []
    assert "CONNECTED" not in out["net"] and "refused" in out["net"].lower()
    assert int(out["pid"].split()[-1]) <= 4  # its own PID namespace: no host processes
    # killed at the timeout, or ended when even its own `sleep` found the limit full
    assert out["bomb"].startswith(("[timed out after 1.5s (killed)]", "[exit code ")), \
        out["bomb"][:200]
    assert "fork" in out["bomb"].lower()  # it hit the process limit
    assert "tidegate.env" in out["main"]
    assert bomb_processes() == []  # the PID namespace died with the command
    if base is not None:  # cgroups removed (or, when another test's kill -9 left one, empty)
        def holds_processes(cgroup: Path) -> bool:
            try:
                return bool((cgroup / "cgroup.procs").read_text().strip())
            except FileNotFoundError:  # removed meanwhile
                return False

        def left() -> list[Path]:
            return [c for c in set(base.glob("tidegate-exec-*")) - before
                    if holds_processes(c)]
        await until(lambda: not left(), timeout=15, what="the sandbox cgroups to empty")


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
                    reason=f"no Docker daemon reachable: {docker_reachable()}")
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


def test_a_bwrap_that_cannot_build_its_namespaces_is_a_start_up_error(tmp_path, monkeypatch):
    """bwrap installed but unable to create namespaces (a seccomp filter such as an old
    systemd unit's, or user namespaces off): every command would fail; the gateway refuses
    to start instead, with bwrap's own words and what to check."""
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace, likely "
                    "because the kernel does not allow non-privileged user namespaces.' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    cfg = base_config(tmp_path / "state")
    cfg["agents"] = {"defaults": {"sandbox": {"mode": "all"}}}
    with pytest.raises(ConfigError) as err:
        parse_config(cfg, "test", env={})
    [problem] = err.value.problems
    assert problem.startswith("agents.defaults.sandbox.backend: bwrap: bwrap cannot create "
                              "its sandbox here (bwrap: No permissions to create new namespace")
    assert "tidegate service install" in problem and "never fall back to the host" in problem


async def test_docker_runs_as_the_gateway_user_and_a_killed_command_leaves_no_container(
        tmp_path, model, monkeypatch):
    """No Docker daemon here, so a stand-in ``docker`` client on PATH records what the
    gateway asks of it (``run`` then runs like a container that never ends), with
    ``$DOCKER_HOST`` pointing at a socket that answers. A command killed at its timeout
    must not leave its container running: killing the client does not stop a real one,
    so the gateway removes it by name."""
    short = Path(tempfile.mkdtemp(prefix="tg-docker-"))  # a unix socket path is short
    calls = short / "calls.log"
    fake = short / "docker"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                    "[ \"$1\" = run ] && exec sleep 30\nexit 0\n")
    fake.chmod(0o755)
    daemon = socket.socket(socket.AF_UNIX)
    daemon.bind(str(short / "docker.sock"))
    daemon.listen()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{short / 'docker.sock'}")
    monkeypatch.setenv("PATH", f"{short}:{os.environ['PATH']}")
    try:
        async with running_gateway(config(tmp_path, model, backend="docker",
                                          mode="all")) as gw:
            ws = gw.config.workspace_for("main")
            model.script_tool_call("exec", {"command": "sleep 30", "timeout": 0.5},
                                   call_id="killed")
            model.script_text("gone")
            assert (await gw.local.send("go", session_key=KEY)).text == "gone"
        log = calls.read_text().splitlines()
    finally:
        daemon.close()
        for f in short.iterdir():
            f.unlink()
        short.rmdir()
    assert results(model)["killed"].startswith("[timed out after 0.5s (killed)]")
    [run] = [line.split() for line in log if line.startswith("run ")]
    name = run[run.index("--name") + 1]
    assert name.startswith("tidegate-exec-")
    assert run[run.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"
    assert run[run.index("--network") + 1] == "none"
    assert run[run.index("-v") + 1] == f"{ws}:{ws}" and "--read-only" in run
    assert f"rm -f {name}" in log  # the container does not outlive its command


@needs_bwrap
async def test_a_workspace_holding_the_state_dir_keeps_it_hidden_and_host_sockets_are_out_of_reach(
        tmp_path, model):
    """bwrap mounts in order: a state dir (or another agent's workspace) inside the
    workspace is hidden after the workspace is bound; without the network the host's
    Unix sockets under /run are gone too, while one in the workspace stays reachable."""
    import secrets as _secrets
    run_dir = Path(f"/run/tidegate-test-{_secrets.token_hex(4)}")
    try:
        run_dir.mkdir()
    except OSError:
        run_dir = None  # /run not writable here: the socket part is skipped
    socks, servers = {}, []
    (tmp_path / "wide").mkdir()
    for name, where in (("run", run_dir), ("ws", tmp_path / "wide")):
        if where is None:
            continue
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(str(where / "host.sock"))
        srv.listen()
        servers.append(srv)
        socks[name] = where / "host.sock"
    cfg = config(tmp_path, model)
    wide = tmp_path / "wide"  # holds another agent's workspace (a state dir it may not)
    cfg["agents"]["list"] = [{"id": "main", "workspace": str(wide / "main-ws")},
                             {"id": "wide", "workspace": str(wide),
                              "sandbox": {"mode": "all"}}]
    connect = ("python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); "
               "s.connect(sys.argv[1]); print(\"CONNECTED\")' ")
    try:
        async with running_gateway(cfg) as gw:
            token = gw.token
            other = gw.config.workspace_for("main")
            other.mkdir(parents=True, exist_ok=True)
            (other / "mine.txt").write_text("main's file\n")
            calls = {"state": f"cat {gw.state_dir}/gateway.token; touch main-ws/PWN; "
                              f"cat {other}/mine.txt"}
            calls.update({f"sock-{k}": connect + str(p) for k, p in socks.items()})
            model.script_tool_calls([{"id": k, "name": "exec", "arguments": {"command": v}}
                                     for k, v in calls.items()])
            model.script_text("checked")
            assert (await gw.local.send("probe", session_key="agent:wide:cli:dm:local")
                    ).text == "checked"
    finally:
        for srv in servers:
            srv.close()
        if run_dir is not None:
            shutil.rmtree(run_dir)
    out = results(model)
    assert token not in out["state"] and "main's file" not in out["state"], out["state"]
    assert not (wide / "main-ws" / "PWN").exists()
    assert "CONNECTED" in out["sock-ws"], out["sock-ws"]  # the workspace's own sockets
    if run_dir is not None:
        assert "CONNECTED" not in out["sock-run"], out["sock-run"]


def test_a_sandboxed_workspace_that_is_the_state_dir_is_a_config_error(tmp_path):
    cfg = base_config(tmp_path / "state", "http://127.0.0.1:9/v1")
    cfg["agents"]["defaults"]["workspace"] = str(tmp_path / "state")
    cfg["agents"]["defaults"]["sandbox"] = {"mode": "all", "backend": "bwrap"}
    if BWRAP is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    with pytest.raises(ConfigError) as err:
        parse_config(cfg, "test", env={})
    assert "agents.defaults.workspace" in str(err.value) and "state dir" in str(err.value)


def test_a_workspace_holding_the_state_dir_is_a_config_error_sandbox_or_not(tmp_path):
    """The file tools run on the host: a workspace around the state dir would let them
    read and rewrite approvals.json, the control token and the config."""
    for sandbox in ({"mode": "off"}, {"mode": "all", "backend": "bwrap"}):
        cfg = base_config(tmp_path / "home" / "state", "http://127.0.0.1:9/v1")
        cfg["agents"]["defaults"]["workspace"] = str(tmp_path / "home")
        cfg["agents"]["defaults"]["sandbox"] = sandbox
        with pytest.raises(ConfigError) as err:
            parse_config(cfg, "test", env={})
        assert "agents.defaults.workspace" in str(err.value), err.value
        assert "holds the state dir" in str(err.value)
    cfg = base_config(tmp_path / "s", "http://127.0.0.1:9/v1")
    cfg["agents"]["defaults"]["workspace"] = str(tmp_path / "s" / "agents")
    with pytest.raises(ConfigError) as err:  # inside the state dir, beside transcripts
        parse_config(cfg, "test", env={})
    assert "outside its workspace/ folder" in str(err.value)
    cfg = base_config(tmp_path / "state", "http://127.0.0.1:9/v1")  # the default layout
    parse_config(cfg, "test", env={})
    cfg["agents"]["defaults"]["workspace"] = str(tmp_path / "state" / "workspace" / "x")
    parse_config(cfg, "test", env={})


@needs_bwrap
def test_the_config_and_env_files_are_blank_in_the_sandbox(tmp_path):
    import subprocess

    from runtime.sandbox.bwrap import bwrap_argv
    from runtime.sandbox.config import SandboxSettings
    from runtime.sandbox.wrap import Sandbox
    etc = tmp_path / "etc-tidegate"
    etc.mkdir()
    (etc / "config.yaml").write_text("token: literal-config-secret\n")
    (etc / "tidegate.env").write_text("OPENAI_API_KEY=sk-env-file-secret\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    box = Sandbox(SandboxSettings(mode="all"), (), (etc / "config.yaml", etc / "tidegate.env"))
    argv = bwrap_argv(BWRAP, ws, list(box.hidden), network=False, cpu_seconds=5,
                      memory_mb=256, hidden_files=list(box.hidden_files))
    # /tmp is private in the sandbox: bind the test's dir back to see the files' place
    argv[argv.index("--tmpfs") + 2:argv.index("--tmpfs") + 2] = ["--ro-bind", str(etc),
                                                                  str(etc)]
    script = f"cat {etc}/config.yaml {etc}/tidegate.env; ls {etc}"
    done = subprocess.run([*argv, "/bin/sh", "-c", script], capture_output=True, text=True,
                          timeout=10)
    assert "config.yaml" in done.stdout  # the files are there...
    assert "secret" not in done.stdout  # ...and blank


def test_docker_covers_a_state_dir_inside_the_workspace(tmp_path):
    from runtime.sandbox.docker import docker_argv
    (tmp_path / "state").mkdir()
    (tmp_path / "config.yaml").write_text("x: 1\n")
    argv = docker_argv(tmp_path, image="img", network=False, cpu_seconds=1, memory_mb=64,
                       max_processes=8, env={}, name="n", owner="o",
                       hidden=[tmp_path / "state", Path("/elsewhere")],
                       hidden_files=[tmp_path / "config.yaml"])
    assert ["--tmpfs", str(tmp_path / "state")] == argv[argv.index(str(tmp_path / "state"))
                                                      - 1:argv.index(str(tmp_path / "state"))
                                                      + 1]
    assert f"/dev/null:{tmp_path / 'config.yaml'}:ro" in argv and "/elsewhere" not in argv


@needs_bwrap
def test_a_workspace_reached_through_a_symlink_is_not_hidden(tmp_path):
    """The state dir holds the workspace, named through a symlink the sandbox also sees
    (outside the private /tmp: under /run, kept with network: true): it is emptied before
    the workspace is bound, never after (which would hide the workspace itself)."""
    import secrets as _secrets
    import subprocess

    from runtime.sandbox.bwrap import bwrap_argv
    base = Path(f"/run/tidegate-test-{_secrets.token_hex(4)}")
    try:
        base.mkdir()
    except OSError:
        pytest.skip("/run is not writable here")
    try:
        state = base / "state"
        (state / "workspace").mkdir(parents=True)
        (state / "workspace" / "f.txt").write_text("visible\n")
        (base / "link").symlink_to(state)
        argv = bwrap_argv(BWRAP, base / "link" / "workspace", [state], network=True,
                          cpu_seconds=5, memory_mb=256)
        done = subprocess.run([*argv, "/bin/sh", "-c", "cat f.txt"], capture_output=True,
                              text=True, timeout=10)
    finally:
        shutil.rmtree(base)
    assert done.stdout == "visible\n", done.stderr
