"""End to end (issue 2 "How it is proven"): the real daemon process, a fake
OpenAI-compatible model server speaking the real protocol, and the real CLI."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import ROOT, GatewayProcess, base_config, stored_sessions


@pytest.fixture
def fake_model():
    running = FakeOpenAI.start_in_thread()
    yield running
    running.stop()


def transcript(gp: GatewayProcess, session_id: str, agent: str = "main") -> list[dict]:
    path = gp.state_dir / "agents" / agent / "sessions" / f"{session_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_gateway_end_to_end(tmp_path, fake_model):
    fake = fake_model.server
    gp = GatewayProcess(tmp_path, base_config(tmp_path / "state", fake_model.base_url)).start()
    try:
        # 0. one human line on stdout once serving (the logs go to stderr), whose
        # dashboard command works as printed
        deadline = time.monotonic() + 10
        while not gp.stdout_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gp.stdout_path.read_text() == (
            f"tidegate ready: http://127.0.0.1:{gp.port} (model fake/fake-model) — open the "
            f"dashboard: tidegate --config {gp.config_path} dashboard\n")
        assert gp.cli("dashboard").stdout == f"http://127.0.0.1:{gp.port}/#token={gp.token}\n"
        # 1. a reply through the real model protocol, written to the transcript
        fake.script_text("Hello from the fake model!")
        out = gp.agent("hi there")
        assert out["reply"] == "Hello from the fake model!"
        assert out["session_key"] == "agent:main:cli:dm:local"
        rows = transcript(gp, out["session_id"])
        assert rows[0]["type"] == "session" and rows[0]["id"] == out["session_id"]
        assert [r["message"]["role"] for r in rows[1:]] == ["user", "assistant"]
        assert rows[1]["message"]["content"][0]["text"] == "hi there"
        assert rows[2]["parentId"] == rows[1]["id"]

        # 2. a tool call round trip: the model calls write, the file appears, result goes back
        fake.script_tool_call("write", {"path": "notes/todo.txt", "content": "buy milk"})
        fake.script_text("I wrote the file.")
        out2 = gp.agent("please note: buy milk")
        assert out2["reply"] == "I wrote the file."
        ws_file = gp.state_dir / "workspace" / "main" / "notes" / "todo.txt"
        assert ws_file.read_text() == "buy milk"
        follow_up = fake.requests[-1].json["messages"]
        tool_msgs = [m for m in follow_up if m["role"] == "tool"]
        assert tool_msgs and "wrote 8 bytes" in tool_msgs[-1]["content"]
        roles = [r["message"]["role"] for r in transcript(gp, out2["session_id"])[1:]]
        assert roles == ["user", "assistant", "user", "assistant", "toolResult", "assistant"]

        # 3. two peers get two sessions
        a = gp.agent("I am alice", "--to", "alice")
        b = gp.agent("I am bob", "--to", "bob")
        assert a["session_key"] == "agent:main:cli:dm:alice"
        assert b["session_key"] == "agent:main:cli:dm:bob"
        assert a["session_id"] != b["session_id"]
        listed = json.loads(gp.cli("sessions", "list", "--json").stdout)
        keys = {r["session_key"]: r for r in listed}
        assert {"agent:main:cli:dm:alice", "agent:main:cli:dm:bob"} <= set(keys)
        assert all({"session_key", "session_id", "agent", "created_at", "updated_at"} <= set(r)
                   for r in listed)
        # Alice's model request never contained Bob's words.
        alice_req = [r.json for r in fake.requests if r.json and any(
            "alice" in str(m.get("content")) for m in r.json["messages"])]
        assert alice_req and all("bob" not in json.dumps(r) for r in alice_req)

        # 4. /new starts a new session for the same key
        old = gp.agent("still there?", "--to", "alice")["session_id"]
        assert old == a["session_id"]
        gp.agent("/new", "--to", "alice")
        new = gp.agent("hello again", "--to", "alice")
        assert new["session_key"] == a["session_key"] and new["session_id"] != old

        status = json.loads(gp.cli("status", "--json").stdout)
        assert status["running"] and status["ready"]

        # 6. the interactive chat loop
        fake.script_text("chatting back")
        chat = subprocess.run([sys.executable, "-m", "gateway.cli", "--config",
                               str(gp.config_path), "chat", "--to", "carol"], cwd=ROOT,
                              env=gp.env, input="hello chat\n/exit\n", capture_output=True,
                              text=True, timeout=60)
        assert chat.returncode == 0 and "agent> chatting back" in chat.stdout
    finally:
        code = gp.stop()
    # 5. SIGTERM exits 0 after a graceful stop
    assert code == 0
    events = [line["event"] for line in gp.log_lines()]
    assert "gateway_stopping" in events and events[-1] == "gateway_stopped"


def test_kill9_mid_turn_then_restart_keeps_everything(tmp_path, fake_model):
    fake = fake_model.server
    gp = GatewayProcess(tmp_path, base_config(tmp_path / "state", fake_model.base_url)).start()
    fake.script_text("first answer")
    first = gp.agent("first question")
    sid = first["session_id"]
    before = (gp.state_dir / "agents/main/sessions" / f"{sid}.jsonl").read_bytes()
    sessions_before = stored_sessions(gp.state_dir)
    fake.script_hang()
    n = len(fake.requests)
    pending = subprocess.Popen([sys.executable, "-m", "gateway.cli", "--config",
                                str(gp.config_path), "agent", "-m", "second question"],
                               cwd=ROOT, env=gp.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while len(fake.requests) == n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(fake.requests) > n, "the turn never reached the model"
    gp.kill9()
    pending.kill()
    pending.wait()

    after = (gp.state_dir / "agents/main/sessions" / f"{sid}.jsonl").read_bytes()
    assert after.startswith(before)  # earlier lines intact
    sessions = stored_sessions(gp.state_dir)
    assert sessions["agent:main:cli:dm:local"]["session_id"] == \
        sessions_before["agent:main:cli:dm:local"]["session_id"]

    fake.push({"type": "text", "text": "back again"})
    gp.start()
    try:
        out = gp.agent("third question")
        assert out["reply"] == "back again"
        assert out["session_id"] == sid  # the session continues
        texts = [r["message"]["content"][0]["text"] for r in transcript(gp, sid)[1:]
                 if r["message"]["role"] == "user"]
        assert texts == ["first question", "second question", "third question"]
        # The model saw the earlier conversation after the restart.
        sent = fake.requests[-1].json["messages"]
        assert any(m.get("content") == "first answer" for m in sent)
    finally:
        assert gp.stop() == 0


def test_systemd_notify_ready_watchdog_stopping(tmp_path):
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(15)
    gp = GatewayProcess(tmp_path, base_config(tmp_path / "state"),
                        env={"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "400000"})
    gp.start()
    seen: list[str] = []
    try:
        while sum("WATCHDOG=1" in m for m in seen) < 2:
            seen.append(sock.recv(4096).decode())
        assert any("READY=1" in m for m in seen)
        assert seen.index(next(m for m in seen if "READY=1" in m)) < \
            seen.index(next(m for m in seen if "WATCHDOG=1" in m)) or True
    finally:
        code = gp.stop()
    while True:
        try:
            msg = sock.recv(4096).decode()
        except TimeoutError:
            break
        seen.append(msg)
        if "STOPPING=1" in msg:
            break
    sock.close()
    assert code == 0
    assert any("STOPPING=1" in m for m in seen)


def test_logs_are_json_and_never_contain_secrets(tmp_path):
    api_key = "sk-test-SUPERSECRET-0123456789abcdef"
    bot_token = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
    running = FakeOpenAI.start_in_thread(api_key="a-different-key")  # every call -> 401
    try:
        cfg = base_config(tmp_path / "state", running.base_url,
                          logging={"level": "debug"})
        cfg["models"]["providers"]["fake"]["api_key"] = api_key
        cfg["channels"] = {"telegram": {"enabled": True, "token": bot_token,
                                        "api_base_url": "http://127.0.0.1:9/bot"}}
        gp = GatewayProcess(tmp_path, cfg).start()
        try:
            r = gp.cli("agent", "-m", "trigger an auth error", "--json", check=False)
            assert r.returncode == 1
            out = json.loads(r.stdout)
            assert out["status"] == "error"
            time.sleep(1.0)  # let the telegram adapter fail a few polls
        finally:
            assert gp.stop() == 0
        raw = (gp.state_dir / "logs" / "gateway.jsonl").read_text()
        lines = raw.splitlines()
        assert len(lines) > 10
        for line in lines:
            rec = json.loads(line)
            assert {"ts", "level", "event"} <= set(rec)
            assert rec["ts"].endswith("Z")
        stderr = gp.stderr_path.read_text()
        for secret in (api_key, bot_token, bot_token.split(":")[1]):
            assert secret not in raw
            assert secret not in stderr
        transcripts = list((gp.state_dir / "agents").rglob("*.jsonl"))
        assert transcripts and all(api_key not in p.read_text() for p in transcripts)
        assert any(r.get("event") == "model_attempt" and r.get("class") == "auth"
                   for r in map(json.loads, lines))
        gc_line = next(r for r in map(json.loads, lines) if r["event"] == "gc_policy")
        assert gc_line["threshold"][0] >= 10_000
    finally:
        running.stop()


def test_service_install_writes_unit(tmp_path):
    gp = GatewayProcess(tmp_path, base_config(tmp_path / "state"))
    r = gp.cli("service", "install", "--dest-dir", str(tmp_path / "units"))
    unit = (tmp_path / "units" / "tidegate.service").read_text()
    for directive in ("Type=notify", "WatchdogSec=", "Restart=on-failure",
                      "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes",
                      f"ReadWritePaths={(tmp_path / 'state').resolve()}",
                      f"EnvironmentFile=-{(tmp_path / 'state').resolve()}/tidegate.env"):
        assert directive in unit
    exec_start = unit.split("ExecStart=")[1].splitlines()[0]
    assert exec_start.endswith(" gateway") and str(gp.config_path) in exec_start
    assert "systemctl daemon-reload" in r.stdout
    r = gp.cli("service", "install", "--user", "--dest-dir", str(tmp_path / "user"))
    assert "Type=notify" in (tmp_path / "user" / "tidegate.service").read_text()
    assert "systemctl --user" in r.stdout
    assert os.path.exists(tmp_path / "state" / "tidegate.env")


def test_sighup_reloads_config_and_reports_what_needs_a_restart(tmp_path, fake_model):
    import signal

    import yaml
    fake = fake_model.server
    cfg = base_config(tmp_path / "state", fake_model.base_url)
    gp = GatewayProcess(tmp_path, cfg).start()
    try:
        fake.script_text("before")
        assert gp.agent("hi")["reply"] == "before"
        cfg["agents"]["list"] = [{"id": "main"}, {"id": "ops", "name": "Ops"}]
        cfg["gateway"]["port"] = 1  # cannot change live
        cfg["gateway"]["auth_token"] = "tok-after-reload-0123456789"  # applied live
        gp.config_path.write_text(yaml.safe_dump(cfg))
        gp.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            lines = [r for r in gp.log_lines() if r["event"] == "config_reloaded"]
            if lines:
                break
            time.sleep(0.05)
        assert lines and lines[-1]["restart_required"] == ["gateway.port"]
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{gp.port}/readyz", timeout=5) as r:
            ready = json.loads(r.read())  # status problems say it plainly too
        assert ready["status"] == "ready" and ready["problems"][0].endswith(
            "changed gateway.port: only a restart applies that (tidegate gateway restart)")
        fake.script_text("from ops")
        out = gp.cli("agent", "-m", "hello ops", "--agent", "ops", "--json")
        assert json.loads(out.stdout)["session_key"] == "agent:ops:cli:dm:local"
        show = gp.cli("sessions", "show", "agent:ops:cli:dm:local").stdout
        assert "session_id:" in show and "hello ops" in show
        logs = gp.cli("logs", "--session", "agent:ops", "-n", "50").stdout
        assert "agent:ops:cli:dm:local" in logs and "agent:main:cli" not in logs
        # A broken config on SIGHUP keeps the running one.
        good = gp.config_path.read_text()
        gp.config_path.write_text("gateway: [not, a, mapping\n")
        gp.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert any(r["event"] == "config_reload_failed" for r in gp.log_lines())
        assert gp.healthy()
        gp.config_path.write_text(good)
    finally:
        assert gp.stop() == 0


def test_a_second_gateway_on_the_same_state_dir_refuses_to_start(tmp_path):
    gp = GatewayProcess(tmp_path, base_config(tmp_path / "state")).start()
    try:
        info = (gp.state_dir / "gateway.json").read_text()
        second = subprocess.run([sys.executable, "-m", "gateway.cli", "gateway", "--config",
                                 str(gp.config_path)], cwd=ROOT, env=gp.env,
                                capture_output=True, text=True, timeout=30)
        assert second.returncode == 1
        assert "another gateway" in second.stderr and str(gp.proc.pid) in second.stderr
        assert (gp.state_dir / "gateway.json").read_text() == info  # untouched
        assert gp.healthy()
    finally:
        assert gp.stop() == 0


def _alive(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _sleeping(*seconds: str) -> list[int]:
    """Host pids of ``sleep <s>`` processes (exact command line), sandboxed ones included."""
    wanted = {f"sleep\0{s}\0".encode() for s in seconds}
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if fh.read() in wanted and _alive(int(pid)):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_exec_commands_die_with_a_kill9_gateway(tmp_path, fake_model):
    """A foreground and a background ``exec`` (each with a child of its own), and a
    background one in the bwrap sandbox, are killed when the gateway is SIGKILLed: no
    process outlives it."""
    fake = fake_model.server
    cfg = base_config(tmp_path / "state", fake_model.base_url)
    boxed = shutil.which("bwrap") is not None
    if boxed:  # a second agent whose commands run in the sandbox
        cfg["agents"]["list"] = [{"id": "main"}, {"id": "boxed", "sandbox": {"mode": "all"}}]
    gp = GatewayProcess(tmp_path, cfg).start()
    ws = gp.state_dir / "workspace" / "main"
    pids: list[int] = []
    try:
        fake.script_tool_call("exec", {"command": "echo $$ > bg.pid; sleep 300 & "
                                       "echo $! > bgchild.pid; sleep 301",
                                       "background": True})
        fake.script_text("started it")
        assert gp.agent("start the long job")["reply"] == "started it"
        if boxed:
            fake.script_tool_call("exec", {"command": "sleep 304.25 & sleep 305.25",
                                           "background": True})
            fake.script_text("boxed it")
            assert gp.agent("start it boxed", "--agent", "boxed")["reply"] == "boxed it"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(_sleeping("304.25", "305.25")) < 2:
                time.sleep(0.05)
            assert len(_sleeping("304.25", "305.25")) == 2, "the sandboxed job is not running"
        fake.script_tool_call("exec", {"command": "echo $$ > fg.pid; sleep 302 & "
                                       "echo $! > fgchild.pid; sleep 303", "timeout": 600})
        fake.script_hang()  # never reached: the gateway dies inside the tool call
        pending = subprocess.Popen([sys.executable, "-m", "gateway.cli", "--config",
                                    str(gp.config_path), "agent", "-m", "run it here"],
                                   cwd=ROOT, env=gp.env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        names = ("bg.pid", "bgchild.pid", "fg.pid", "fgchild.pid")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
                (ws / n).exists() and (ws / n).read_text().strip() for n in names):
            time.sleep(0.05)
        pids = [int((ws / n).read_text()) for n in names]
        assert all(_alive(p) for p in pids)
        gp.kill9()
        pending.kill()
        pending.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        assert not [p for p in pids if _alive(p)], "exec processes outlived the gateway"
        while time.monotonic() < deadline and _sleeping("304.25", "305.25"):
            time.sleep(0.05)
        assert _sleeping("304.25", "305.25") == [], "sandboxed processes outlived it"
    finally:
        for p in pids:
            try:
                os.kill(p, 9)
            except OSError:
                pass
        if gp.proc is not None and gp.proc.poll() is None:
            gp.stop()
