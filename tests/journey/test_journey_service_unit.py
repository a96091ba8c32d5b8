"""Stage: the systemd units ``tidegate service install`` writes pass ``systemd-analyze
verify`` (when the tool exists), run as an unprivileged account, and root is refused."""

from __future__ import annotations

import shutil
import subprocess

import pytest

ANALYZE = shutil.which("systemd-analyze")


def _verify(operator, unit, user: bool) -> None:
    runtime = operator.home / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    r = subprocess.run([ANALYZE, *(["--user"] if user else []), "verify", str(unit)],
                       env=operator.env({"XDG_RUNTIME_DIR": str(runtime)}),
                       capture_output=True, text=True, timeout=60)
    # systemd-analyze exits 0 on unknown keys and bad values too: any line about the
    # unit is a finding
    complaints = [line for line in (r.stdout + r.stderr).splitlines() if unit.name in line]
    assert r.returncode == 0 and complaints == [], r.stdout + r.stderr


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
def test_user_and_system_units_verify_and_never_run_as_root(operator):
    operator.ok("setup", "--non-interactive", "--provider", "echo")
    user_dir, system_dir = operator.home / "user-units", operator.home / "system-units"
    out = operator.ok("service", "install", "--user", "--dest-dir", str(user_dir)).stdout
    user_unit = user_dir / "tidegate.service"
    assert f"wrote {user_unit}" in out
    assert "User=" not in user_unit.read_text()
    assert f"ExecStart={operator.install.bin / 'tidegate'}" in user_unit.read_text()
    _verify(operator, user_unit, user=True)

    refused = operator.run("service", "install", "--dest-dir", str(system_dir),
                           "--user-name", "root")
    assert refused.returncode == 2 and "refusing to run the gateway as root" in refused.stderr
    assert not (system_dir / "tidegate.service").exists()

    operator.ok("service", "install", "--dest-dir", str(system_dir))
    text = (system_dir / "tidegate.service").read_text()
    for directive in ("User=tidegate", "Group=tidegate", "CapabilityBoundingSet=",
                      "PrivateTmp=yes", f"ReadWritePaths={operator.state}",
                      "SystemCallFilter=@system-service"):
        assert directive in text.splitlines(), directive
    _verify(operator, system_dir / "tidegate.service", user=False)
