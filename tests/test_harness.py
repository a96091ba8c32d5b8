"""The test harness itself: a failing test never leaks its gateway subprocess."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_failed_test_does_not_leave_its_gateway_running(tmp_path):
    pid_file = tmp_path / "pid"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "tests/probes/probe_leaked_gateway.py"],
        cwd=ROOT, env={**os.environ, "PROBE_PID_FILE": str(pid_file)},
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout[-2000:]
    assert "failing on purpose" in r.stdout
    pid = int(pid_file.read_text())
    if _alive(pid):
        os.kill(pid, 9)
        raise AssertionError(f"the probe's gateway (pid {pid}) outlived its test")
    assert "killing a gateway the test left running" in r.stdout
