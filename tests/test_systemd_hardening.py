"""The system unit runs as an unprivileged account and is sandboxed; ``service install``
sets the account (``--user-name``, never root unless ``--allow-root``); ``service
uninstall`` reports a failing ``systemctl``. The CLI runs in-process; units are checked
with ``systemd-analyze verify`` (tests/test_systemd.py ``_verify``)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.service.unit import render_unit
from tests.test_systemd import REPO, _directives, _system_unit, _verify


@pytest.fixture
def cli(tmp_path, capsys):
    """``run(*args) -> (code, stdout, stderr)`` with a config whose state dir is in
    tmp_path; units go to ``tmp_path/units``."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"gateway": {"state_dir": str(tmp_path / "state")}}))

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["--config", str(cfg), *args])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def test_install_writes_an_unprivileged_user_and_refuses_root(cli, tmp_path):
    units = tmp_path / "units"
    code, out, err = cli("service", "install", "--dest-dir", str(units))
    assert code == 0, err
    lines = _directives((units / "tidegate.service").read_text())
    assert "User=tidegate" in lines and "Group=tidegate" in lines
    assert f"  state owner:   chown -R tidegate: {tmp_path / 'state'}" in out.splitlines()

    code, out, err = cli("service", "install", "--dest-dir", str(units), "--user-name",
                         "svc", "--group-name", "daemon")
    assert code == 0, err
    lines = _directives((units / "tidegate.service").read_text())
    assert "User=svc" in lines and "Group=daemon" in lines

    (units / "tidegate.service").unlink()
    code, out, err = cli("service", "install", "--dest-dir", str(units), "--user-name", "root")
    assert (code, out) == (2, "")
    assert err == ("error: --user-name root: refusing to run the gateway as root (the "
                   "agent's exec tool would run commands as root); use an unprivileged "
                   "account, or add --allow-root\n")
    assert not (units / "tidegate.service").exists()
    code, out, err = cli("service", "install", "--dest-dir", str(units), "--user-name", "root",
                         "--allow-root")
    assert code == 0, err
    assert "User=root" in _directives((units / "tidegate.service").read_text())

    code, _, err = cli("service", "install", "--dest-dir", str(units), "--user-name", "x;y")
    assert code == 2 and "error: user: 'x;y' is not a valid user or group name" in err
    code, _, err = cli("service", "install", "--user", "--dest-dir", str(units),
                       "--user-name", "svc")
    assert code == 2 and "apply to system units only" in err


def test_protect_home_keeps_a_state_dir_under_home_writable(tmp_path):
    lines = _directives(_system_unit(tmp_path))  # state dir under /tmp: homes hidden
    assert "ProtectHome=yes" in lines
    home = _directives(_system_unit(tmp_path, state_dir=Path("/home/ann/.tidegate")))
    # hidden homes would hide the state dir too: homes read-only, the state dir writable
    assert "ProtectHome=read-only" in home and "ReadWritePaths=/home/ann/.tidegate" in home
    root = _directives(_system_unit(tmp_path, state_dir=Path("/root/.tidegate")))
    assert "ProtectHome=read-only" in root


def test_shipped_replica_template_is_hardened_and_verifies(tmp_path):
    template = (REPO / "systemd" / "tidegate@.service").read_text()
    system = _directives(_system_unit(tmp_path))
    lines = _directives(template)
    same = [d for d in system if d.split("=")[0] in {
        "NoNewPrivileges", "RestrictSUIDSGID", "LockPersonality", "RestrictRealtime",
        "RestrictAddressFamilies", "SystemCallArchitectures", "SystemCallFilter",
        "SystemCallErrorNumber", "ProtectSystem", "ProtectHome", "PrivateTmp",
        "PrivateDevices", "ProtectKernelTunables", "ProtectKernelModules",
        "ProtectKernelLogs", "ProtectControlGroups", "ProtectClock", "ProtectHostname",
        "CapabilityBoundingSet", "AmbientCapabilities"}]
    assert len(same) == 20 and all(d in lines for d in same), set(same) - set(lines)
    assert "User=tidegate" in lines and "Group=tidegate" in lines
    assert "ReadWritePaths=/var/lib/tidegate/%i" in lines
    runnable = template.replace("/opt/tidegate/.venv/bin/tidegate", sys.executable)
    _verify(runnable, tmp_path, name="tidegate@a.service")


@pytest.mark.parametrize("user_mode", [False, True])
def test_verify_catches_a_bad_directive(tmp_path, user_mode):
    """The check itself can fail: systemd-analyze exits 0 on an unknown key."""
    unit = render_unit(exec_start=f"{sys.executable} -m gateway.cli gateway",
                       state_dir=tmp_path / "s", config_path=None, env_file=None,
                       user_mode=user_mode)
    bad = unit.replace("NoNewPrivileges=yes", "NoNewPrivileges=yes\nProtectNothing=yes")
    with pytest.raises(AssertionError, match="ProtectNothing"):
        _verify(bad, tmp_path, user_mode=user_mode)


def test_uninstall_reports_a_failing_systemctl(cli, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text("#!/bin/sh\necho 'Failed to connect to bus: No medium found' >&2\n"
                    "exit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    units = tmp_path / "units"
    assert cli("service", "install", "--user", "--dest-dir", str(units))[0] == 0
    code, out, err = cli("service", "uninstall", "--user", "--dest-dir", str(units))
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        ("error: `systemctl --user disable --now tidegate.service` failed (exit 1): Failed "
         "to connect to bus: No medium found"),
        (f"nothing removed: {units / 'tidegate.service'} is kept so the service stays "
         "manageable; fix the above and run this again (or remove the file by hand)")]
    assert (units / "tidegate.service").exists()

    # stopping works, the reload after removing does not: removed, but exit 1 and said
    fake.write_text("#!/bin/sh\n[ \"$2\" = daemon-reload ] || exit 0\n"
                    "echo 'Access denied' >&2\nexit 4\n")
    code, out, err = cli("service", "uninstall", "--user", "--dest-dir", str(units))
    assert code == 1 and out.startswith(f"removed {units / 'tidegate.service'}")
    assert err == ("error: `systemctl --user daemon-reload` failed (exit 4): "
                   "Access denied\n")
    assert not (units / "tidegate.service").exists()
