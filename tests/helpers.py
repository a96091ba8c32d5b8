"""Test helpers: run the real gateway in-process or as a subprocess.

``running_gateway(tmp_path, config)`` starts a Gateway in this event loop (HTTP on a free
port); ``GatewayProcess`` runs ``tidegate gateway`` as a real process with its own state dir,
for end-to-end tests (signals, kill -9, systemd notify).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import yaml

from gateway.config.load import parse_config
from gateway.service.daemon import Gateway

ROOT = Path(__file__).resolve().parent.parent


def install_plugin(root: Path, dist: str, name: str, module: str, source: str,
                   group: str = "tidegate.channels") -> None:
    """A distribution ``dist`` 1.2.3 in ``root`` (a directory on ``sys.path``) whose entry
    point ``name`` of ``group`` is ``<module>:PLUGIN``, the module's text ``source``;
    importlib.metadata finds it as it finds installed ones (call ``plugins.forget()``)."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {module}:PLUGIN\n")


def stored_sessions(state_dir: Path, agent: str = "main") -> dict[str, dict[str, Any]]:
    """The session store of ``agent`` as committed on disk (``sessions.db``, read with
    plain sqlite3): ``{session_key: entry}``, {} when the store does not exist yet."""
    path = state_dir / "agents" / agent / "sessions" / "sessions.db"
    if not path.exists():
        return {}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {k: json.loads(v) for k, v in
                conn.execute("SELECT session_key, entry FROM sessions")}
    finally:
        conn.close()


def base_config(state_dir: Path, model_url: str | None = None, **sections: Any) -> dict:
    cfg: dict[str, Any] = {"gateway": {"state_dir": str(state_dir), "port": 0,
                                       "shutdown_grace": "5s"},
                           "messages": {"queue": {"mode": "followup", "debounce": 0}},
                           # hermetic: never the real ~/.agents/skills
                           "skills": {"personal_dir": str(state_dir / "personal-skills")}}
    if model_url:
        cfg["models"] = {"providers": {"fake": {"api": "openai", "base_url": model_url,
                                                "api_key": "sk-test-0123456789abcdef"}},
                         "retries": 0}
        cfg["agents"] = {"defaults": {"model": "fake/fake-model"}}
    for k, v in sections.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    return cfg


@contextlib.asynccontextmanager
async def running_gateway(config: dict, clock: Any = None) -> AsyncIterator[Gateway]:
    loaded = parse_config(config, "test", env={})
    kwargs = {"clock": clock} if clock is not None else {}
    gw = Gateway(loaded, **kwargs)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


class GatewayProcess:
    """``tidegate gateway`` as a subprocess. ``cli(...)`` runs other commands with the same
    config; ``stop()`` sends SIGTERM and returns the exit code. Every started process is
    in ``GatewayProcess.live`` until it is stopped or killed, so the conftest fixture
    ``_reap_gateways`` kills what a failed or timed-out test left running."""

    live: ClassVar[set[GatewayProcess]] = set()

    def __init__(self, tmp: Path, config: dict, env: dict[str, str] | None = None,
                 python: str | None = None) -> None:
        self.tmp = tmp
        self.python = python or sys.executable  # another venv's interpreter (plugins)
        self.state_dir = Path(config["gateway"]["state_dir"])
        self.config_path = tmp / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("TIDEGATE_CONFIG", "TIDEGATE_STATE_DIR", "NOTIFY_SOCKET",
                                 "WATCHDOG_USEC", "WATCHDOG_PID")}
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None
        self.stderr_path = tmp / "gateway.stderr"
        self.stdout_path = tmp / "gateway.stdout"
        self._stdout: Any = None  # opened by start(); a test may set proc itself

    def start(self, timeout: float = 60.0) -> GatewayProcess:
        info = self.state_dir / "gateway.json"
        if info.exists():
            info.unlink()
        self._stderr = open(self.stderr_path, "ab")
        self._stdout = open(self.stdout_path, "ab")
        self.proc = subprocess.Popen(
            [self.python, "-m", "gateway.cli", "gateway", "--config", str(self.config_path)],
            cwd=ROOT, env=self.env, stdout=self._stdout, stderr=self._stderr)
        GatewayProcess.live.add(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}: "
                                   f"{self.stderr_path.read_text()[-3000:]}")
            if info.exists() and self.healthy():
                return self
            time.sleep(0.05)
        self.kill9()  # never leave a half-started gateway running after the test
        raise TimeoutError(f"gateway did not become healthy in {timeout}s: "
                           f"{self.stderr_path.read_text()[-3000:]}")

    @property
    def port(self) -> int:
        return json.loads((self.state_dir / "gateway.json").read_text())["port"]

    @property
    def token(self) -> str:
        return (self.state_dir / "gateway.token").read_text().strip()

    def healthy(self) -> bool:
        import urllib.request
        try:
            port = json.loads((self.state_dir / "gateway.json").read_text())["port"]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                return r.status == 200
        except Exception:  # noqa: BLE001
            return False

    def cli(self, *args: str, timeout: float = 60.0,
            check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([self.python, "-m", "gateway.cli", "--config",
                            str(self.config_path), *args], cwd=ROOT, env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"tidegate {' '.join(args)} -> {r.returncode}\n{r.stderr}")
        return r

    def agent(self, text: str, *extra: str) -> dict:
        return json.loads(self.cli("agent", "-m", text, "--json", *extra).stdout)

    def stop(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        self._stderr.close()
        if self._stdout is not None:
            self._stdout.close()
        GatewayProcess.live.discard(self)
        return code

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)
        self._stderr.close()
        if self._stdout is not None:
            self._stdout.close()
        GatewayProcess.live.discard(self)

    def log_lines(self) -> list[dict]:
        path = self.state_dir / "logs" / "gateway.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
