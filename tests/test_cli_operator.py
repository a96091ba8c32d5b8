"""Issue 14 points 1-6: what an operator sees from the CLI (hermetic client, honest
errors, help, version, no reprs) — the real CLI as a subprocess against the real gateway
and a fake model."""

from __future__ import annotations

import json
import os
import re
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


def test_a_token_this_state_dirs_gateway_rejects_names_the_token_file(tmp_path, fake_model):
    # the operator replaced gateway.token while the gateway runs with the old one
    gw = GatewayProcess(tmp_path, base_config(tmp_path / "state", fake_model.base_url)).start()
    try:
        token_file = tmp_path / "state" / "gateway.token"
        token_file.write_text("not-the-running-token\n")
        for args in (["status"], ["agent", "-m", "hello"]):
            r = tidegate(*args, "--config", str(gw.config_path))
            assert r.returncode == 1, r
            assert f"rejected the token ({token_file})" in r.stderr, r.stderr
            assert "error: unauthorized" not in r.stdout + r.stderr
    finally:
        gw.stop()


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
        assert re.match(r"waiting for fake/fake-model… retry 1/2 in 0\.0\d* s \(fake: HTTP 503",
                        progress[1]), progress  # the backoff has jitter
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


# -- point 6: version, help, names, reprs --------------------------------------------------

def _walk(parser, path=()):
    import argparse
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for name, child in action.choices.items():
                if id(child) not in seen:  # aliases share one parser
                    seen.add(id(child))
                    yield from _walk(child, (*path, name))


def test_every_command_and_option_has_help_and_user_facing_names():
    import argparse

    from gateway.cli import build_parser
    missing = []
    for path, parser in _walk(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._SubParsersAction):
                names = {c.dest for c in action._choices_actions if c.help}
                missing += [f"{' '.join(path)} {n} (command)" for n in action.choices
                            if n not in names]
                assert action.metavar and "_" not in action.metavar, path
                continue
            if not action.help:
                missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_version_and_errors_use_user_facing_names():
    from importlib.metadata import version
    r = tidegate("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tidegate {version('tidegate')}"
    r = tidegate("sessions")
    assert r.returncode == 2 and "_cmd" not in r.stderr and "list" in r.stderr
    r = tidegate("cron")
    assert r.returncode == 2 and "_cmd" not in r.stderr


def test_status_human_output_has_no_python_reprs(tmp_path, fake_model):
    gp = GatewayProcess(tmp_path, base_config(tmp_path / "state",
                                              fake_model.base_url)).start()
    try:
        fake_model.server.script_text("hi")
        gp.agent("hello")
        out = gp.cli("status").stdout
        assert "{" not in out and "None" not in out and "'" not in out, out
        assert "1 session," in out or "1 session\n" in out
        assert "lanes: " in out
    finally:
        gp.stop()


def test_system_prompt_names_agents_md_once(tmp_path):
    from runtime.prompt import Identity, PromptBuilder, ensure_workspace
    ensure_workspace(tmp_path / "ws")
    prompt = PromptBuilder(identity=Identity("main"), workspace=tmp_path / "ws",
                           tool_lines=[]).stable_prefix()
    assert prompt.count("# AGENTS.md") == 1
    assert "You are a helpful personal assistant" in prompt


def test_config_validate_reads_the_units_env_file_and_suggests_keys(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("gateway: {state_dir: %s}\nmodels:\n  providers:\n"
                   "    o: {api: openai, api_key: '${QA_ENVFILE_KEY}'}\n" % (tmp_path / "s"))
    r = tidegate("config", "validate", "--config", str(cfg))
    assert r.returncode == 2 and "QA_ENVFILE_KEY is not set" in r.stderr
    env = tmp_path / "tidegate.env"
    env.write_text("# secrets\nQA_ENVFILE_KEY=\"sk-from-file\"\n\nOTHER='x'\n")
    r = tidegate("config", "validate", "--config", str(cfg), "--env-file", str(env))
    assert r.returncode == 0, r.stderr
    assert f"env file {env}" in r.stdout and "sk-from-file" not in r.stdout
    env.write_text("this is not an assignment\n")
    r = tidegate("config", "validate", "--config", str(cfg), "--env-file", str(env))
    assert r.returncode == 2 and "line 1: expected NAME=value" in r.stderr
    r = tidegate("config", "validate", "--config", str(cfg), "--env-file",
                 str(tmp_path / "missing.env"))
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr

    cfg.write_text("gateway:\n  prot: 1\nchannels:\n  telegram:\n    dm_polcy: open\n")
    r = tidegate("config", "validate", "--config", str(cfg))
    assert "gateway.prot: unknown key (did you mean 'port'?)" in r.stderr
    assert "channels.telegram.dm_polcy: unknown key (did you mean 'dm_policy'?)" in r.stderr


def test_gateway_port_and_bind_flags(tmp_path, fake_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    cfg = base_config(tmp_path / "state", fake_model.base_url)
    gp = GatewayProcess(tmp_path, cfg)
    r = tidegate("gateway", "--config", str(gp.config_path), "--bind", "0.0.0.0")
    assert r.returncode == 2 and "--bind: must be a loopback address" in r.stderr
    gp_args = ["--port", str(free), "--bind", "127.0.0.1"]
    import subprocess as sp
    proc = sp.Popen([sys.executable, "-m", "gateway.cli", "gateway", "--config",
                     str(gp.config_path), *gp_args], cwd=ROOT, env=gp.env,
                    stdout=sp.DEVNULL, stderr=sp.DEVNULL)
    gp.proc = proc
    gp._stderr = open(os.devnull, "wb")
    try:
        import time
        deadline = time.monotonic() + 20
        while not gp.healthy() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gp.port == free
        assert json.loads(gp.cli("status", "--json").stdout)["running"] is True
    finally:
        gp.stop()


# -- `agent -m` start-up: only the gateway section, none of the command groups -------------

def test_agent_m_loads_only_what_talking_to_the_gateway_needs(tmp_path):
    """``agent -m`` used to take ~950 ms, most of it importing every tool module and
    building the whole config schema; it now reads only the ``gateway`` section (the
    figure: bench/operator_bench.py). The turn still runs and state-dir overrides hold."""
    gw = GatewayProcess(tmp_path, base_config(tmp_path / "state")).start()
    try:
        probe = ("import sys; from gateway.cli.main import main; "
                 "code = main(sys.argv[1:]); "
                 "heavy = sorted(m for m in ('gateway.config.schema', 'gateway.tools.services', "
                 "'runtime.tools.registry', 'numpy', 'aiohttp', 'structlog') "
                 "if m in sys.modules); "
                 "print('HEAVY', heavy, file=sys.stderr); sys.exit(code)")
        r = subprocess.run([sys.executable, "-c", probe, "--config", str(gw.config_path),
                            "agent", "-m", "ping", "-q"], capture_output=True, text=True,
                           cwd=ROOT, env=gw.env, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "You said: ping" in r.stdout
        assert "HEAVY []" in r.stderr
        # a bad key of the gateway section is still named
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump({"gateway": {"state_dir": str(gw.state_dir),
                                                   "prot": 1}}))
        r = tidegate("agent", "-m", "x", "--config", str(bad))
        assert r.returncode == 2 and "gateway.prot: unknown key" in r.stderr
        r = tidegate("agent", "-m", "x", "--config", str(tmp_path / "elsewhere.yaml"),
                     env={"TIDEGATE_STATE_DIR": str(gw.state_dir)})
        assert r.returncode == 2  # a missing --config file is still named
        (tmp_path / "elsewhere.yaml").write_text("gateway: {state_dir: /nonexistent}\n")
        r = tidegate("agent", "-m", "via env", "-q", "--config",
                     str(tmp_path / "elsewhere.yaml"),
                     env={"TIDEGATE_STATE_DIR": str(gw.state_dir)})
        assert r.returncode == 0 and "You said: via env" in r.stdout, r.stderr
    finally:
        gw.stop()
