"""The env file rule, ``gateway restart``'s pre-check and failed reloads in ``status``:
what an operator sees, with the real CLI as a subprocess in a clean environment (no
inherited secrets, a private HOME and state dir) against a real gateway process and the
fake model.

The rule: ``<state_dir>/tidegate.env`` is read by every command (``--env-file`` another,
``--no-env-file`` none); the process environment wins over it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from gateway.config.env_file import EnvFileValues, ProcessEnv
from gateway.config.reload import ReloadReport
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import ROOT

FILE_KEY = "sk-from-the-env-file-0123456789"
ROTATED = "sk-rotated-in-the-env-file-98765"


class Operator:
    """A shell with nothing exported but PATH and a private HOME."""

    def __init__(self, tmp: Path) -> None:
        self.home = tmp / "home"
        self.home.mkdir()
        self.env = {"PATH": os.environ["PATH"], "HOME": str(self.home), "LANG": "C.UTF-8"}

    def run(self, *args: str, timeout: float = 90, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=ROOT,
                              env={**self.env, **extra}, capture_output=True, text=True,
                              timeout=timeout)


def _pid(state: Path) -> int | None:
    try:
        return json.loads((state / "gateway.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def _readyz(state: Path) -> dict:
    port = json.loads((state / "gateway.json").read_text())["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
        assert r.status == 200
        return json.loads(r.read())


def _wait(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def model():
    running = FakeOpenAI.start_in_thread(api_key={FILE_KEY, ROTATED})
    yield running
    running.stop()


def test_setups_next_step_works_and_restart_and_reload_keep_a_healthy_gateway(tmp_path,
                                                                                model):
    op = Operator(tmp_path)
    state, config = tmp_path / "state", tmp_path / "state" / "config.yaml"
    cfg = _setup(op, state, config, model)
    good, env_file = config.read_text(), state / "tidegate.env"
    _the_env_file_rule(op, tmp_path, config, env_file)
    try:
        pid = _foreground_then_restart(op, tmp_path, state, config, cfg, env_file, model)
        _failed_reload_is_shown_until_one_succeeds(op, state, config, env_file, good, model,
                                                   pid)
        _unit_restart_checks_the_units_environment(op, tmp_path, config, cfg)
    finally:
        pid = _pid(state)
        if pid and op.run("--config", str(config), "gateway", "stop").returncode != 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _setup(op: Operator, state: Path, config: Path, model) -> dict:
    model.server.script_text("OK")
    r = op.run("setup", "--non-interactive", "--state-dir", str(state), "--provider",
               "openai", "--model", "fake-model", "--base-url", model.base_url,
               "--api-key-env", "QA_KEY", QA_KEY=FILE_KEY)
    assert r.returncode == 0, r.stderr
    assert f"start it: tidegate --config {config} gateway" in r.stdout
    cfg = yaml.safe_load(config.read_text())
    cfg["gateway"]["port"] = 0  # hermetic: never the default port
    config.write_text(yaml.safe_dump(cfg))
    return cfg


def _the_env_file_rule(op: Operator, tmp_path: Path, config: Path, env_file: Path) -> None:
    """Read by default; --no-env-file turns it off; --env-file names another file."""
    r = op.run("--config", str(config), "config", "validate")
    assert r.returncode == 0, r.stderr
    assert f"env file {env_file}" in r.stdout and FILE_KEY not in r.stdout + r.stderr
    r = op.run("--config", str(config), "config", "validate", "--no-env-file")
    assert r.returncode == 2 and "QA_KEY is not set" in r.stderr
    other = tmp_path / "other.env"  # a malformed one: file and line, never a value
    other.write_text(f"QA_KEY={FILE_KEY}\nnot an assignment\n")
    r = op.run("--config", str(config), "--env-file", str(other), "status")
    assert r.returncode == 2, r.stdout
    assert f"{other}, line 2: expected NAME=value" in r.stderr
    assert FILE_KEY not in r.stdout + r.stderr


def _foreground_then_restart(op, tmp_path, state, config, cfg, env_file, model) -> int:
    """`tidegate --config … gateway` with nothing exported serves; a restart the new
    process would refuse leaves it serving; a good one replaces it. The new pid."""
    out = open(tmp_path / "gateway.out", "wb")
    gw = subprocess.Popen([sys.executable, "-m", "gateway.cli", "--config", str(config),
                           "gateway"], cwd=ROOT, env=op.env, stdout=out, stderr=out)
    try:
        _wait(lambda: gw.poll() is not None or _pid(state) == gw.pid and _ready(state),
              "the foreground gateway")
        assert gw.poll() is None, (tmp_path / "gateway.out").read_text()
        model.server.script_text("OK")
        r = op.run("--config", str(config), "agent", "-m", "hi", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["reply"] == "OK"
        assert model.server.requests[-1].headers["authorization"] == f"Bearer {FILE_KEY}"

        cfg["models"]["providers"]["spare"] = {"api": "openai", "api_key": "${QA_SPARE}",
                                               "base_url": model.base_url}
        config.write_text(yaml.safe_dump(cfg))
        r = op.run("--config", str(config), "gateway", "restart")
        assert r.returncode == 2, r.stdout + r.stderr
        assert "models.providers.spare.api_key: environment variable QA_SPARE is not set" \
            in r.stderr
        assert "not restarted" in r.stderr and "keeps serving" in r.stderr
        assert gw.poll() is None and _pid(state) == gw.pid and _ready(state)
        env_file.write_text(f"QA_KEY={FILE_KEY}\nQA_SPARE=sk-spare-0123456789\n")
        # (the new gateway inherits INVOCATION_ID: to the CLI it runs under a unit, below)
        r = op.run("--config", str(config), "gateway", "restart", INVOCATION_ID="qa",
                   QA_UNIT_ONLY="sk-unit-0123456789")
        assert r.returncode == 0, r.stderr
        new_pid = _pid(state)
        assert new_pid != gw.pid and f"started gateway (pid {new_pid})" in r.stdout
        assert gw.wait(timeout=30) == 0
        return new_pid
    finally:
        if gw.poll() is None:
            gw.kill()
            gw.wait()
        out.close()


def _ready(state: Path) -> bool:
    try:
        return _readyz(state)["status"] == "ready"
    except (OSError, ValueError, KeyError):
        return False


def _failed_reload_is_shown_until_one_succeeds(op, state, config, env_file, good, model,
                                               pid) -> None:
    config.write_text(good + "media: {album_wait: soon}\n")  # an unrelated section broken
    r = op.run("--config", str(config), "gateway", "reload")  # SIGHUP, and the outcome
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert line.startswith("reload at ") and "failed: media.album_wait" in line
    assert line.endswith("; still running the previous config")
    assert _readyz(state)["problems"] == [line]
    # status answers from the running gateway (exit 0), with the reload and the file
    r = op.run("--config", str(config), "status")
    assert r.returncode == 0, r.stderr
    assert line in r.stdout and f"pid {pid}" in r.stdout
    assert f"config file {config} is invalid" in r.stdout and "media.album_wait" in r.stdout

    # the file fixed and the secret rotated in the env file: the next reload applies it
    config.write_text(good)
    env_file.write_text(f"QA_KEY={ROTATED}\nQA_SPARE=sk-spare-0123456789\n")
    os.kill(pid, signal.SIGHUP)  # kill -HUP (systemctl reload) does the same
    _wait(lambda: "problems" not in _readyz(state), "the failed reload to clear")
    model.server.script_text("rotated")
    r = op.run("--config", str(config), "agent", "-m", "again", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["reply"] == "rotated", r.stderr
    assert model.server.requests[-1].headers["authorization"] == f"Bearer {ROTATED}"
    logged = [json.loads(x) for x in (state / "logs" / "gateway.jsonl").read_text()
              .splitlines() if '"config_reloaded"' in x]
    assert logged[-1]["env_changed"] == ["QA_KEY"]
    assert ROTATED not in (state / "logs" / "gateway.jsonl").read_text()


def _unit_restart_checks_the_units_environment(op, tmp_path, config, cfg) -> None:
    """Under a unit, restart is `systemctl restart`: the check uses the environment the
    unit gives the gateway (read from the running one), not the operator's shell."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "systemctl.calls"
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (bin_dir / "systemctl").chmod(0o755)
    path = f"{bin_dir}:{op.env['PATH']}"
    cfg["models"]["providers"]["unit"] = {"api": "openai", "api_key": "${QA_UNIT_ONLY}",
                                          "base_url": "http://127.0.0.1:9/v1"}
    config.write_text(yaml.safe_dump(cfg))
    r = op.run("--config", str(config), "gateway", "restart", PATH=path)
    assert r.returncode == 0, r.stderr
    assert calls.read_text().split()[-2:] == ["restart", "tidegate"]
    cfg["models"]["providers"]["unit"]["api_key"] = "${QA_NOWHERE}"
    config.write_text(yaml.safe_dump(cfg))
    r = op.run("--config", str(config), "gateway", "restart", PATH=path)
    assert r.returncode == 2 and "QA_NOWHERE is not set" in r.stderr
    assert len(calls.read_text().splitlines()) == 1  # systemctl was not asked


# -- the parts on their own ----------------------------------------------------------------

def test_the_environment_wins_and_systemd_handed_values_follow_the_file():
    read = EnvFileValues(Path("/x/tidegate.env"), {"A": "file", "B": "file",
                                                   "TIDEGATE_STATE_DIR": "/elsewhere"})
    assert read.merged({"A": "env"}) == {"A": "env", "B": "file"}
    # started by systemd: B arrived from EnvironmentFile= (same value), A was exported
    environ = {"A": "env", "B": "file", "PATH": "/bin"}
    penv = ProcessEnv(environ)
    assert penv.apply(read) == []  # nothing changed: B was already there
    assert environ["A"] == "env" and environ["B"] == "file"
    rotated = EnvFileValues(read.path, {"A": "file2", "B": "file2", "C": "new"})
    assert penv.apply(rotated) == ["B", "C"]
    assert environ == {"A": "env", "B": "file2", "C": "new", "PATH": "/bin"}
    assert penv.apply(EnvFileValues(read.path, {"A": "x"})) == ["B", "C"]
    assert environ == {"A": "env", "PATH": "/bin"}


def test_reload_report_texts():
    rep = ReloadReport()
    assert rep.problems() == []
    rep.failed(1_767_225_600.25, ["media.album_wait: not a duration", "x: y"])
    assert rep.problems() == [("reload at 2026-01-01T00:00:00Z failed: media.album_wait: "
                              "not a duration; still running the previous config")]
    rep.succeeded(1_767_225_660.0, ["channels"], ["TELEGRAM_BOT_TOKEN"])
    assert rep.problems() == [("reload at 2026-01-01T00:01:00Z changed channels: only a "
                              "restart applies that (tidegate gateway restart)")]
    assert rep.status()["env_changed"] == ["TELEGRAM_BOT_TOKEN"]
    rep.succeeded(1_767_225_720.0, [], [])
    assert rep.problems() == []
