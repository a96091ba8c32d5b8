"""``tidegate gateway status|stop|restart``: the running gateway of this state dir.

``stop`` sends SIGTERM to the pid in ``<state_dir>/gateway.json`` — after ``/healthz`` has
confirmed that the process on that port is this state dir's gateway — and waits for the
drain (``gateway.shutdown_grace``) to finish. ``restart`` goes through systemd when the
gateway runs under a unit (``systemctl [--user] restart tidegate``), else stops it and
starts ``tidegate gateway`` again in the background (output appended to
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
from gateway.config.load import LoadedConfig


def _client(loaded: LoadedConfig) -> Any:
    from gateway.cli.client import ControlClient
    return ControlClient.from_config(loaded)


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


def restart(loaded: LoadedConfig, config_arg: str | None) -> int:
    pid = _pid(loaded)
    scope = _systemd_scope(pid) if pid and _client(loaded).is_up() else None
    if scope is not None:
        cmd = ["systemctl", *(["--user"] if scope == "user" else []), "restart", "tidegate"]
        return subprocess.run(cmd, check=False).returncode
    if pid is not None and _client(loaded).is_up() and stop(loaded, quiet=True) != 0:
        return 1
    logs = loaded.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "gateway.cli", "gateway"]
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
