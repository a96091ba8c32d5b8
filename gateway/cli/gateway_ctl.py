"""``tidegate gateway status|stop|reload|restart``: the running gateway of this state dir.

``reload`` sends SIGHUP (what ``systemctl reload`` does) and waits for the outcome: exit 0
applied (naming what waits for a restart), 2 refused (the gateway keeps its config).

``stop`` sends SIGTERM to the pid in ``<state_dir>/gateway.json`` — after ``/healthz`` has
confirmed that the process on that port is this state dir's gateway — and waits for the
drain (``gateway.shutdown_grace``) to finish. ``restart`` first loads what the new process
will load — its config file, its env file, its environment, every ``${VAR}`` set — and
refuses (exit 2, the old gateway untouched) when that fails; then it goes through systemd
when the gateway runs under a unit (``systemctl [--user] restart tidegate``; the check
uses the unit's command line and environment, read from the running process), else
stops it and starts ``tidegate gateway`` again in the background (output appended to
``<state_dir>/logs/gateway.out``) and waits until it is ready.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gateway.cli.client import pid_alive as _alive
from gateway.config.env_file import EnvFileChoice
from gateway.config.load import ConfigError, LoadedConfig


def _client(loaded: LoadedConfig) -> Any:
    from gateway.cli.client import ControlClient
    return ControlClient.from_config(loaded)


def _running_port(loaded: LoadedConfig) -> int | None:
    try:
        return int(json.loads((loaded.state_dir / "gateway.json").read_text())["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _pid(loaded: LoadedConfig) -> int | None:
    try:
        return int(json.loads((loaded.state_dir / "gateway.json").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def status(loaded: LoadedConfig, as_json: bool) -> int:
    from gateway.cli.client import ApiError, GatewayUnavailable
    from gateway.cli.output import print_json, render_status
    try:
        st = _client(loaded).request("GET", "/status", timeout=10)
    except (GatewayUnavailable, ApiError) as exc:
        print_json({"running": False, "error": str(exc)}) if as_json else \
            print(f"gateway: not running ({exc})")
        return 1
    print_json({**st, "running": True}) if as_json else print(render_status(st))
    return 0


def stop(loaded: LoadedConfig, *, quiet: bool = False) -> int:
    client = _client(loaded)
    pid = _pid(loaded)
    if pid is None or not client.is_up():
        print(f"gateway: not running ({client.why or 'no answer on its port'})",
              file=sys.stderr)
        return 1
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + loaded.config.gateway.shutdown_grace + 15
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        print(f"error: gateway (pid {pid}) is still draining after "
              f"{loaded.config.gateway.shutdown_grace:g}s + 15s", file=sys.stderr)
        return 1
    if not quiet:
        print(f"stopped gateway (pid {pid})")
    return 0


def reload(loaded: LoadedConfig, timeout: float = 120.0) -> int:
    """SIGHUP the running gateway and report how its reload went (module docstring)."""
    from gateway.cli.client import ApiError, GatewayUnavailable
    client = _client(loaded)
    pid = _pid(loaded)
    try:
        before = client.request("GET", "/status", timeout=10)["reload"]["count"]
    except (GatewayUnavailable, ApiError, KeyError, TypeError) as exc:
        print(f"gateway: not running ({exc})" if pid is None or not client.is_up() else
              f"error: the running gateway cannot report reloads ({exc})", file=sys.stderr)
        return 1
    if pid is None:
        print("gateway: not running (no gateway.json)", file=sys.stderr)
        return 1
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            st = client.request("GET", "/status", timeout=10)
        except (GatewayUnavailable, ApiError):
            continue
        rep = st["reload"]
        if rep["count"] == before:
            continue
        if rep["failed_at"]:
            print(f"reload at {rep['failed_at']} failed: {rep['error']}; still running the "
                  "previous config", file=sys.stderr)
            return 2
        print(f"reloaded gateway (pid {pid})")
        if rep["restart_required"]:
            print(f"only a restart applies: {', '.join(rep['restart_required'])} "
                  "(tidegate gateway restart)")
        return 0
    print(f"error: the gateway did not report the reload within {timeout:g} s",
          file=sys.stderr)
    return 1


def _systemd_scope(pid: int) -> str | None:
    """``"system"``/``"user"`` when ``pid`` runs under a systemd unit, else None."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    if not any(v.startswith(b"INVOCATION_ID=") for v in environ):
        return None
    return "user" if "/user@" in cgroup else "system"


def _unit_start(pid: int, env_file: EnvFileChoice) -> tuple[str | None, EnvFileChoice,
                                                              dict[str, str]]:
    """(config arg, env-file choice, environment) a unit's next start of the gateway
    ``pid`` will use: its command line and environment now, with the env file's current
    values over it (systemd reads ``EnvironmentFile=`` afresh at every start). Falls back
    to ours where /proc cannot be read."""
    try:
        argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        environ = dict(v.decode(errors="replace").partition("=")[::2] for v in raw if v)
    except OSError:
        return None, env_file, dict(os.environ)
    config_arg: str | None = None
    for i, word in enumerate(argv):
        if word == "--config" and i + 1 < len(argv):
            config_arg = argv[i + 1]
        elif word.startswith("--config="):
            config_arg = word.partition("=")[2]
        elif word == "--env-file" and i + 1 < len(argv):
            env_file = EnvFileChoice(path=Path(argv[i + 1]))
        elif word == "--no-env-file":
            env_file = EnvFileChoice(enabled=False)
    from gateway.config.load import env_file_for
    try:  # EnvironmentFile= (the default env file, as `service install` writes it) wins
        environ.update(env_file_for(config_arg, environ, EnvFileChoice()).values)
    except ConfigError:
        pass  # the precheck names it
    return config_arg, env_file, environ


def precheck(config_arg: str | None, env_file: EnvFileChoice,
             env: dict[str, str], running_port: int | None = None) -> list[str]:
    """What the new gateway process would refuse at start (``tidegate gateway``'s own
    load: strict ``${VAR}``, the env file; a new port another process listens on), as
    lines to print; [] when it would start."""
    from gateway.service.run import load_for_start
    try:
        new = load_for_start(config_arg, {}, env=env, env_file=env_file)
    except ConfigError as exc:
        return exc.render().splitlines()
    return _port_taken(new.config.gateway.bind, new.config.gateway.port, running_port)


def _port_taken(bind: str, port: int, running_port: int | None) -> list[str]:
    """A problem when the new config moves the gateway to a port something else holds
    (the running gateway frees only its own port when it stops)."""
    import socket
    if port == 0 or port == running_port:
        return []
    host = "127.0.0.1" if bind == "localhost" else bind
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return [(f"gateway.port: {host}:{port} is in use by another process "
                     f"({exc.strerror}); the new gateway could not listen there")]
    return []


def restart(loaded: LoadedConfig, config_arg: str | None,
            env_file: EnvFileChoice | None = None) -> int:
    """Restart the gateway after :func:`precheck` passed. 0 restarted, 1 failed, 2 the
    new process would not start (nothing was stopped)."""
    env_file = env_file or EnvFileChoice()
    pid = _pid(loaded)
    scope = _systemd_scope(pid) if pid and _client(loaded).is_up() else None
    running_port = _running_port(loaded)
    if scope is not None:
        check = precheck(*_unit_start(pid, env_file), running_port=running_port)
    else:
        check = precheck(config_arg, env_file, dict(os.environ), running_port)
    if check:
        print("\n".join(check), file=sys.stderr)
        print("not restarted: the new process would refuse this config; the running "
              "gateway keeps serving" if pid and _client(loaded).is_up() else
              "not started: the gateway would refuse this config", file=sys.stderr)
        return 2
    if scope is not None:
        cmd = ["systemctl", *(["--user"] if scope == "user" else []), "restart", "tidegate"]
        return subprocess.run(cmd, check=False).returncode
    if pid is not None and _client(loaded).is_up() and stop(loaded, quiet=True) != 0:
        return 1
    logs = loaded.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "gateway.cli", *env_file.argv(), "gateway"]
    if config_arg:
        argv += ["--config", str(Path(config_arg).resolve())]
    with open(logs / "gateway.out", "ab") as out:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                 start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if child.poll() is not None:
            print(f"error: the gateway exited with {child.returncode}; see "
                  f"{logs / 'gateway.out'}", file=sys.stderr)
            return 1
        if _pid(loaded) == child.pid and _client(loaded).is_up():
            print(f"started gateway (pid {child.pid})")
            return 0
        time.sleep(0.05)
    print("error: the gateway did not become ready within 60 s", file=sys.stderr)
    return 1
