"""Issue 14 points 1-6: what an operator sees from the CLI (hermetic client, honest
errors, help, version, no reprs) — the real CLI as a subprocess against the real gateway
and a fake model."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import ROOT, GatewayProcess, base_config


def tidegate(*args: str, env: dict | None = None, timeout: float = 60,
             input: str | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("TIDEGATE_CONFIG",
                                                          "TIDEGATE_STATE_DIR")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True,
                          text=True, env=e, cwd=ROOT, timeout=timeout, input=input)


@pytest.fixture
def fake_model():
    running = FakeOpenAI.start_in_thread()
    yield running
    running.stop()


class CountingListener:
    """A TCP listener on a free loopback port that counts connections (a stranger's
    service, or another gateway, sitting on the port a config names)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def write_config(tmp_path: Path, **gateway) -> Path:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"gateway": {"state_dir": str(tmp_path / "state"),
                                               **gateway}}))
    return cfg


# -- point 1: the CLI never reaches a gateway it did not start ----------------------------

def test_cli_without_running_gateway_never_connects_to_the_configured_port(tmp_path):
    other = CountingListener()
    try:
        cfg = write_config(tmp_path, port=other.port)
        for args in (["status"], ["agent", "-m", "hi"]):
            r = tidegate(*args, "--config", str(cfg))
            assert r.returncode == 1, (args, r.stdout, r.stderr)
            assert "no gateway is running for state dir" in r.stdout + r.stderr
        # offline commands read the files instead
        assert tidegate("cron", "list", "--config", str(cfg)).returncode == 0
        assert tidegate("sessions", "list", "--config", str(cfg)).returncode == 0
        assert other.accepted == 0
    finally:
        other.close()


def test_stale_gateway_json_of_a_dead_gateway_is_not_followed(tmp_path):
    other = CountingListener()
    try:
        cfg = write_config(tmp_path)
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / "gateway.json").write_text(json.dumps(
            {"pid": dead.pid, "port": other.port, "bind": "127.0.0.1"}))
        r = tidegate("status", "--config", str(cfg))
        assert r.returncode == 1 and f"(pid {dead.pid}) has exited" in r.stdout
        assert other.accepted == 0
    finally:
        other.close()


# -- point 2: a gateway of another state dir on the port -----------------------------------

def test_gateway_of_another_state_dir_is_named(tmp_path, fake_model):
    (tmp_path / "a").mkdir()
    a = GatewayProcess(tmp_path / "a", base_config(tmp_path / "a" / "state",
                                                   fake_model.base_url)).start()
    try:
        b = tmp_path / "b"
        b.mkdir()
        cfg = write_config(b)
        (b / "state").mkdir()
        # b's gateway.json names a live pid (ours) and the port a's gateway now holds
        (b / "state" / "gateway.json").write_text(json.dumps(
            {"pid": os.getpid(), "port": a.port, "bind": "127.0.0.1"}))
        (b / "state" / "gateway.token").write_text("b-token-not-a's\n")
        r = tidegate("status", "--config", str(cfg))
        assert r.returncode == 1
        assert "belongs to another state dir" in r.stdout
        assert "unauthorized" not in r.stdout + r.stderr
        r = tidegate("agent", "-m", "hello", "--config", str(cfg))
        assert r.returncode == 1 and "belongs to another state dir" in r.stderr
    finally:
        a.stop()


# -- point 3: progress on stderr, streaming chat with history ------------------------------

def test_agent_shows_progress_on_stderr_and_chat_streams_with_history(tmp_path, fake_model):
    fake = fake_model.server
    cfg = base_config(tmp_path / "state", fake_model.base_url)
    cfg["models"]["retries"] = 2
    cfg["models"]["retry_backoff"] = "50ms"
    gp = GatewayProcess(tmp_path, cfg).start()
    try:
        fake.script_error(503)
        fake.script_tool_call("write", {"path": "a.txt", "content": "x"})
        fake.script_text("All done.")
        r = gp.cli("agent", "-m", "go")
        assert r.stdout == "All done.\n"  # stdout is only the reply
        progress = r.stderr.splitlines()
        assert progress[0] == "waiting for fake/fake-model…"
        assert progress[1].startswith("waiting for fake/fake-model… retry 1/2 in 0.05 s (")
        assert "running tool write…" in progress
        fake.script_text("quiet")
        assert gp.cli("agent", "-m", "again", "--quiet").stderr == ""

        # chat through a pty: readline editing/history, streamed deltas
        import pexpect
        fake.script_text("streamed reply in several words")
        child = pexpect.spawn(sys.executable, ["-m", "gateway.cli", "--config",
                                               str(gp.config_path), "chat"],
                              cwd=str(ROOT), env=gp.env, encoding="utf-8", timeout=30)
        child.expect("you> ")
        child.sendline("first question")
        child.expect("agent> streamed reply in several words")
        child.expect("you> ")
        fake.script_text("second answer")
        child.send("\x1b[A")  # arrow up: the previous line from readline's history
        child.sendline(" again")
        child.expect("agent> second answer")
        child.expect("you> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
        assert fake.requests[-1].json["messages"][-1]["content"] == "first question again"
        hist = gp.state_dir / "cli_history"
        assert "first question again" in hist.read_text()
        assert hist.stat().st_mode & 0o777 == 0o600
    finally:
        gp.stop()
