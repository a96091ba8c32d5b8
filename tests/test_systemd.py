"""systemd integration (gateway/service/notify.py, gateway/service/unit.py): sd_notify over a real Unix datagram socket,
the watchdog loop driven by FakeClock, unit rendering (checked with systemd-analyze when
it is installed) and service install into a temporary directory."""

from __future__ import annotations

import asyncio
import io
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gateway.service.notify import SystemdNotifier, watchdog_loop
from gateway.service.unit import (
    ENV_PLACEHOLDERS,
    default_exec_start,
    install_service,
    render_unit,
)
from runtime.clock import FakeClock

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def notify_socket(monkeypatch):
    """A bound AF_UNIX datagram socket standing in for systemd; NOTIFY_SOCKET points at it.
    (A short dir under /tmp: socket paths are limited to 108 bytes.)"""
    d = tempfile.mkdtemp(prefix="tg-sd-", dir="/tmp")
    path = os.path.join(d, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    yield sock
    sock.close()
    shutil.rmtree(d, ignore_errors=True)


def _drain(sock: socket.socket) -> list[str]:
    got = []
    while True:
        try:
            got.append(sock.recv(4096).decode())
        except BlockingIOError:
            return got


async def test_ready_watchdog_stopping_reach_the_socket(notify_socket):
    notifier = SystemdNotifier.from_env()
    assert notifier.enabled and notifier.watchdog_interval() == pytest.approx(0.1)
    assert notifier.notify("READY=1", "STATUS=serving") is True
    assert _drain(notify_socket) == ["READY=1\nSTATUS=serving"]

    clock, stop = FakeClock(), asyncio.Event()
    health = {"ok": True}
    task = asyncio.create_task(watchdog_loop(notifier, clock, stop, lambda: health["ok"]))
    await clock.settle()
    assert _drain(notify_socket) == ["WATCHDOG=1"]  # first ping at once
    # interval 0.1 s (half of 200 ms); offsets of 0.01 keep float rounding out of it
    await clock.advance(0.09)
    assert _drain(notify_socket) == []
    await clock.advance(0.02)  # t = 0.11
    assert _drain(notify_socket) == ["WATCHDOG=1"]
    await clock.advance(0.2)  # t = 0.31
    assert _drain(notify_socket) == ["WATCHDOG=1", "WATCHDOG=1"]

    health["ok"] = False  # an unhealthy gateway stops pinging -> systemd restarts it
    with capture_logs() as logs:
        await clock.advance(0.3)  # t = 0.61
    assert _drain(notify_socket) == []
    assert [e["event"] for e in logs] == ["watchdog_ping_withheld"]
    health["ok"] = True
    await clock.advance(0.1)
    assert _drain(notify_socket) == ["WATCHDOG=1"]

    stop.set()
    await asyncio.wait_for(task, 1)
    assert notifier.notify("STOPPING=1")
    assert _drain(notify_socket) == ["STOPPING=1"]
    notifier.close()


async def test_raising_health_check_counts_as_unhealthy(notify_socket):
    notifier = SystemdNotifier.from_env()
    clock, stop = FakeClock(), asyncio.Event()

    def broken() -> bool:
        raise RuntimeError("probe exploded")

    task = asyncio.create_task(watchdog_loop(notifier, clock, stop, broken))
    await clock.advance(0.25)
    assert _drain(notify_socket) == []
    stop.set()
    await asyncio.wait_for(task, 1)


async def test_abstract_namespace_socket(monkeypatch):
    name = f"tidegate-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(1)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        monkeypatch.delenv("WATCHDOG_USEC", raising=False)
        notifier = SystemdNotifier.from_env()
        assert notifier.notify("READY=1")
        assert sock.recv(100) == b"READY=1"
        assert notifier.watchdog_interval() is None
        # no watchdog: the loop returns at once instead of spinning
        await asyncio.wait_for(watchdog_loop(notifier, FakeClock(), asyncio.Event()), 1)
        notifier.close()
    finally:
        sock.close()


@pytest.mark.parametrize("env, expected", [
    ({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000"}, 15.0),
    ({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "SELF"}, 15.0),
    ({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
    ({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "soon"}, None),
    ({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "30000000"}, None),  # nobody to ping
])
def test_watchdog_interval_from_env(env, expected):
    env = {k: (str(os.getpid()) if v == "SELF" else v) for k, v in env.items()}
    assert SystemdNotifier.from_env(env).watchdog_interval() == expected


def test_unset_socket_is_a_noop_and_failures_do_not_raise(tmp_path):
    off = SystemdNotifier.from_env({})
    assert not off.enabled and off.notify("READY=1") is False
    assert not SystemdNotifier.from_env({"NOTIFY_SOCKET": "vsock:2:1234"}).enabled
    gone = SystemdNotifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "missing.sock")})
    with capture_logs() as logs:
        assert gone.notify("READY=1") is False
    assert logs[0]["event"] == "sd_notify_failed" and logs[0]["log_level"] == "warning"
    with pytest.raises(ValueError):
        gone.notify("STATUS=two\nlines")
    with pytest.raises(ValueError):
        gone.notify()


# --- unit rendering ---------------------------------------------------------------------

SYSTEM_DIRECTIVES = [
    "Type=notify", "NotifyAccess=main", "ExecReload=/bin/kill -HUP $MAINPID",
    "Restart=on-failure", "RestartSec=5", "WatchdogSec=60", "TimeoutStopSec=60",
    "KillSignal=SIGTERM", "NoNewPrivileges=yes", "ProtectSystem=strict",
    "ProtectHome=yes", "PrivateTmp=yes", "PrivateDevices=yes", "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes", "ProtectKernelLogs=yes", "ProtectControlGroups=yes",
    "RestrictSUIDSGID=yes", "LockPersonality=yes", "RestrictRealtime=yes",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "SystemCallFilter=@system-service", "CapabilityBoundingSet=",
    "WantedBy=multi-user.target",
]


def _directives(unit: str) -> list[str]:
    return [ln for ln in unit.splitlines() if ln and not ln.startswith(("#", "["))]


def _system_unit(tmp_path: Path, **kw) -> str:
    args = {"exec_start": f"{sys.executable} -m gateway.cli gateway --config "
                          f"{tmp_path}/config.yaml",
            "state_dir": tmp_path / "state", "config_path": tmp_path / "config.yaml",
            "env_file": tmp_path / "tidegate.env", "user_mode": False,
            "user": pwd.getpwuid(os.getuid()).pw_name}
    args.update(kw)
    return render_unit(**args)


def test_system_unit_has_every_directive(tmp_path):
    unit = _system_unit(tmp_path)
    lines = _directives(unit)
    for d in SYSTEM_DIRECTIVES:
        assert d in lines, d
    assert f"ExecStart={sys.executable} -m gateway.cli gateway --config " \
           f"{tmp_path}/config.yaml" in lines
    assert f"EnvironmentFile=-{tmp_path}/tidegate.env" in lines
    assert f"Environment=TIDEGATE_CONFIG={tmp_path}/config.yaml" in lines
    assert f"Environment=TIDEGATE_STATE_DIR={tmp_path}/state" in lines
    assert f"ReadWritePaths={tmp_path}/state" in lines
    assert f"User={pwd.getpwuid(os.getuid()).pw_name}" in lines
    assert f"Group={pwd.getpwuid(os.getuid()).pw_name}" in lines
    assert not any(ln.startswith("MemoryDenyWriteExecute") for ln in lines)
    assert "MemoryDenyWriteExecute" in unit  # ...but the comment says why


def test_user_unit_differs_where_it_must(tmp_path):
    unit = render_unit(exec_start="/usr/bin/tidegate gateway", state_dir=tmp_path / "st",
                       config_path=None, env_file=None, user_mode=True, user="ignored",
                       watchdog_sec=0)
    lines = _directives(unit)
    assert "WantedBy=default.target" in lines and "WatchdogSec=0" in lines
    assert "Type=notify" in lines and "NoNewPrivileges=yes" in lines
    for seccomp in ("SystemCallFilter=@system-service", "RestrictRealtime=yes",
                    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK"):
        assert seccomp in lines, seccomp  # a user manager applies seccomp filters
    for absent in ("User=", "Group=", "ProtectHome=", "ProtectSystem=", "EnvironmentFile=",
                   "Environment=TIDEGATE_CONFIG=", "PrivateDevices=", "PrivateTmp=",
                   "ProtectKernel", "CapabilityBoundingSet=", "ReadWritePaths="):
        assert not any(ln.startswith(absent) for ln in lines), absent


def test_unit_escapes_specifiers_and_rejects_bad_paths(tmp_path):
    unit = _system_unit(tmp_path, state_dir=tmp_path / "100%state")
    assert f"ReadWritePaths={tmp_path}/100%%state" in unit.splitlines()
    with pytest.raises(ValueError, match="state_dir"):
        _system_unit(tmp_path, state_dir=tmp_path / "with space")
    with pytest.raises(ValueError, match="exec_start"):
        _system_unit(tmp_path, exec_start="/bin/true\nExecStartPre=/bin/evil")


def _verify(unit_text: str, tmp_path: Path, *, user_mode: bool = False,
            name: str = "tidegate.service") -> None:
    """``systemd-analyze [--user] verify``: fails on its exit code and on every line it
    prints about this unit (unknown keys and bad values are only warnings, exit 0).
    Skipped only where the tool is not installed (CI installs Debian's ``systemd``)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed")
    path = tmp_path / name
    path.write_text(unit_text)
    runtime = tmp_path / "xdg-runtime"  # a user manager needs $XDG_RUNTIME_DIR
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    proc = subprocess.run([tool, *(["--user"] if user_mode else []), "verify", str(path)],
                          capture_output=True, text=True, timeout=60, check=False, env=env)
    ours = [ln for ln in proc.stderr.splitlines() if str(path) in ln or "tidegate" in ln]
    assert proc.returncode == 0 and not ours, proc.stderr


@pytest.mark.parametrize("user_mode", [False, True])
def test_rendered_unit_passes_systemd_analyze_verify(tmp_path, user_mode):
    (tmp_path / "state").mkdir()
    unit = _system_unit(tmp_path, user_mode=user_mode)
    _verify(unit, tmp_path, user_mode=user_mode)


def test_static_template_matches_renderer_and_verifies(tmp_path):
    template = (REPO / "systemd" / "tidegate.service").read_text()
    assert template == render_unit(
        exec_start="/opt/tidegate/.venv/bin/tidegate gateway --config "
                   "/var/lib/tidegate/config.yaml",
        state_dir=Path("/var/lib/tidegate"), config_path=Path("/var/lib/tidegate/config.yaml"),
        env_file=Path("/etc/tidegate/tidegate.env"), user_mode=False, user="tidegate")
    # verify needs an executable that exists and a known user
    me = pwd.getpwuid(os.getuid()).pw_name
    runnable = template.replace("/opt/tidegate/.venv/bin/tidegate", sys.executable) \
        .replace("User=tidegate", f"User={me}")
    _verify(runnable, tmp_path)


# --- install ----------------------------------------------------------------------------

def test_install_user_service(tmp_path):
    out = io.StringIO()
    state, env_file = tmp_path / "state", tmp_path / "state" / "secrets.env"
    exec_start = default_exec_start(tmp_path / "config.yaml")
    path = install_service(user_mode=True, exec_start=exec_start, state_dir=state,
                           config_path=tmp_path / "config.yaml", env_file=env_file,
                           dest_dir=tmp_path / "units", out=out)
    assert path == tmp_path / "units" / "tidegate.service"
    assert path.read_text() == render_unit(
        exec_start=exec_start, state_dir=state, config_path=tmp_path / "config.yaml",
        env_file=env_file, user_mode=True)
    assert path.stat().st_mode & 0o777 == 0o644
    assert state.stat().st_mode & 0o777 == 0o700
    assert env_file.stat().st_mode & 0o777 == 0o600
    body = env_file.read_text()
    for name in ENV_PLACEHOLDERS:
        assert f"# {name}=..." in body
    text = out.getvalue()
    assert "systemctl --user daemon-reload && systemctl --user enable --now tidegate" in text
    assert "loginctl enable-linger $USER" in text
    assert "tidegate logs -f" in text and "journalctl --user -u tidegate" in text
    assert not list((tmp_path / "units").glob(".tidegate.service.*"))  # no temp left over

    # a second install keeps the user's secrets and warns about loose permissions
    env_file.write_text("OPENAI_API_KEY=sk-real\n")
    env_file.chmod(0o644)
    out2 = io.StringIO()
    install_service(user_mode=True, exec_start=exec_start, state_dir=state,
                    config_path=tmp_path / "config.yaml", env_file=env_file,
                    dest_dir=tmp_path / "units", out=out2)
    assert env_file.read_text() == "OPENAI_API_KEY=sk-real\n"
    assert "chmod 600" in out2.getvalue()


def test_install_system_service_prints_system_commands(tmp_path):
    out = io.StringIO()
    path = install_service(user_mode=False, exec_start="/usr/bin/tidegate gateway",
                           state_dir=tmp_path / "var", config_path=None, env_file=None,
                           dest_dir=tmp_path / "etc", out=out, user="tidegate")
    unit = path.read_text()
    assert "WantedBy=multi-user.target" in unit and "User=tidegate" in unit
    text = out.getvalue()
    assert "systemctl daemon-reload && systemctl enable --now tidegate" in text
    assert "--user" not in text and "linger" not in text
    assert f"chown -R tidegate: {tmp_path / 'var'}" in text
    assert "journalctl -u tidegate" in text


def test_default_exec_start_is_absolute_and_runnable(tmp_path):
    cmd = default_exec_start(tmp_path / "c.yaml")
    assert cmd.endswith(f" gateway --config {tmp_path}/c.yaml")
    exe = cmd.split()[0]
    assert os.path.isabs(exe) and os.access(exe, os.X_OK)
    assert default_exec_start(None).endswith(" gateway")


def test_broken_config_is_not_restarted_forever_and_user_unit_skips_network_online(tmp_path):
    lines = _directives(_system_unit(tmp_path))
    # exit 2 = invalid config: no restart loop; and any crash loop hits a start limit
    assert "RestartPreventExitStatus=2" in lines
    assert "StartLimitIntervalSec=300" in lines and "StartLimitBurst=5" in lines
    unit = _system_unit(tmp_path).split("[Service]")[0]
    assert "StartLimitBurst=5" in unit  # [Unit] section (systemd.unit(5))
    assert "After=network-online.target" in lines
    user = _directives(_system_unit(tmp_path, user_mode=True))
    assert not any("network-online.target" in ln for ln in user)
    assert "RestartPreventExitStatus=2" in user


@pytest.mark.parametrize("user_mode", [False, True])
def test_a_bwrap_sandbox_gets_the_mount_calls_and_still_verifies(tmp_path, user_mode):
    """@system-service leaves out @mount, which bwrap needs to build the exec sandbox's
    mount namespace: a unit for a config with a bwrap sandbox allows it, one without does
    not."""
    (tmp_path / "state").mkdir()
    def filters(unit: str) -> list[str]:
        return [ln.split("=", 1)[1] for ln in _directives(unit)
                if ln.startswith("SystemCallFilter=")]

    unit = _system_unit(tmp_path, user_mode=user_mode, sandbox=True)
    assert filters(unit) == ["@system-service", "@mount"]
    assert filters(_system_unit(tmp_path, user_mode=user_mode)) == ["@system-service"]
    _verify(unit, tmp_path, user_mode=user_mode)


def test_service_install_allows_mount_only_when_an_agent_uses_bwrap(tmp_path):
    import yaml

    from gateway.cli.main import main as cli_main

    for sandbox, expected in (({"mode": "non-main"}, True), ({"mode": "off"}, False)):
        cfg = tmp_path / f"{sandbox['mode']}.yaml"
        cfg.write_text(yaml.safe_dump({"gateway": {"state_dir": str(tmp_path / "s")},
                                       "agents": {"defaults": {"sandbox": sandbox}}}))
        dest = tmp_path / f"units-{sandbox['mode']}"
        assert cli_main(["--config", str(cfg), "--no-env-file", "service", "install",
                         "--user", "--dest-dir", str(dest)]) == 0
        assert ("SystemCallFilter=@mount" in (dest / "tidegate.service").read_text()) \
            is expected
