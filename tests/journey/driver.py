"""An operator at a shell, driving the installed ``tidegate`` (tests/journey/install.py).

Every command runs as a subprocess of the installed venv's ``tidegate`` with a clean
environment: ``PATH`` (the venv's ``bin/`` first), a private ``HOME`` (so the default state
dir is ``$HOME/.tidegate``), ``LANG`` and ``TZ``, and nothing else unless a step passes it,
as a user who exported nothing would. The working directory is ``HOME``, never the
checkout. Standard library and PyYAML only: nothing of the product is imported.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.journey.install import Install


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``condition()`` every 50 ms until it returns something truthy; returns it.
    Raises AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not reached within {timeout:g} s")


@dataclass
class Foreground:
    """``tidegate gateway`` running in the operator's terminal (stdout and stderr kept in
    files, as a terminal would show them)."""

    proc: subprocess.Popen
    out: Path
    err: Path

    def output(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        """Ctrl-C's signal (SIGTERM as systemd sends); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


@dataclass
class Operator:
    """One operator account: ``home`` is its private ``$HOME``; ``state`` the default
    state dir under it."""

    install: Install
    home: Path
    started: list[subprocess.Popen] = field(default_factory=list)

    @property
    def state(self) -> Path:
        return self.home / ".tidegate"

    @property
    def config_path(self) -> Path:
        return self.state / "config.yaml"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {"PATH": f"{self.install.bin}:/usr/local/bin:/usr/bin:/bin",
               "HOME": str(self.home), "LANG": "C.UTF-8", "TZ": "UTC"}
        return {**env, **(extra or {})}

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess:
        """``tidegate ARGS`` to completion; the result keeps stdout, stderr, returncode."""
        return subprocess.run(["tidegate", *args], cwd=self.home, env=self.env(env),
                              capture_output=True, text=True, timeout=timeout,
                              input=input, stdin=None if input is not None else
                              subprocess.DEVNULL)

    def ok(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
        """``run`` that must exit 0 (the assertion shows what the operator saw)."""
        r = self.run(*args, **kw)
        assert r.returncode == 0, (f"tidegate {' '.join(args)} exited {r.returncode}\n"
                                   f"stdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-3000:]}")
        return r

    def json(self, *args: str, **kw: Any) -> Any:
        return json.loads(self.ok(*args, "--json", **kw).stdout)

    # -- the config file, as an editor would change it ----------------------------------
    def config(self) -> dict[str, Any]:
        return yaml.safe_load(self.config_path.read_text())

    def edit_config(self, change: Any) -> None:
        """Apply ``change(cfg)`` to config.yaml in place (mode kept)."""
        cfg = self.config()
        change(cfg)
        self.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))

    @property
    def port(self) -> int:
        return int(self.config()["gateway"]["port"])

    # -- the gateway in the foreground ----------------------------------------------------
    def start_gateway(self, *args: str, env: dict[str, str] | None = None,
                      port: int | None = None, timeout: float = 60.0) -> Foreground:
        """``tidegate ARGS gateway`` in the foreground, returned once ``/readyz`` answers
        200 on ``port`` (default: the one in config.yaml). Raises AssertionError with its
        output if it exits first."""
        n = len(self.started)
        out, err = self.home / f"gateway-{n}.out", self.home / f"gateway-{n}.err"
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(["tidegate", *args, "gateway"], cwd=self.home,
                                    env=self.env(env), stdin=subprocess.DEVNULL, stdout=o,
                                    stderr=e, start_new_session=True)
        self.started.append(proc)
        fg = Foreground(proc, out, err)

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"gateway exited {proc.returncode}:\n{fg.output()[-4000:]}")
            return self.ready(port)
        wait_for(ready, timeout, "the gateway answering /readyz")
        return fg

    def ready(self, port: int | None = None) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port or self.port}/readyz",
                                        timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def cleanup(self) -> None:
        """Stop what this operator left running: foreground gateways, and a gateway that
        ``gateway restart`` started in the background (``gateway stop``)."""
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        if self.config_path.exists() and "port" in (self.config().get("gateway") or {}) \
                and self.ready():
            self.run("gateway", "stop", timeout=60)
        pid_file = self.state / "gateway.json"
        if pid_file.exists():  # a gateway that did not answer: never leak it
            try:
                os.kill(int(json.loads(pid_file.read_text())["pid"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass
