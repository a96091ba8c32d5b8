"""CLI robustness: bad input and broken pipes give one clear line (or none), never a
traceback, and one-shot commands print their results, not structlog lines.

Every test runs the real CLI as a subprocess (``python -m gateway.cli``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from channels.access.pairing import PairingStore
from gateway.logs.records import nonneg_int
from runtime.clock import SYSTEM_CLOCK
from runtime.timeline import Timeline
from tests.helpers import base_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(tmp_path / "state")))
    return path


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("TIDEGATE_CONFIG", "TIDEGATE_STATE_DIR")}


def tidegate(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "--config", str(config), *args],
                          capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=60)


def _clean(r: subprocess.CompletedProcess) -> None:
    """No traceback and no structlog console line on either stream."""
    both = r.stdout + r.stderr
    assert "Traceback" not in both, both
    assert "[info" not in both and "[warning" not in both, both


# ---- unknown options ------------------------------------------------------------------


def test_an_unknown_option_without_a_command_is_named():
    r = subprocess.run([sys.executable, "-m", "gateway.cli", "--bogus"], capture_output=True,
                       text=True, cwd=ROOT, env=_env(), timeout=60)
    assert r.returncode == 2
    assert "unrecognized arguments: --bogus" in r.stderr, r.stderr
    _clean(r)


# ---- logs -n ----------------------------------------------------------------------------


def test_nonneg_int_rejects_negative_and_non_numbers_as_usage_errors():
    assert nonneg_int("0") == 0 and nonneg_int("25") == 25
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 0, got -5"):
        nonneg_int("-5")
    with pytest.raises(argparse.ArgumentTypeError, match="whole number"):
        nonneg_int("ten")


def test_logs_negative_lines_is_a_usage_error(config, tmp_path):
    logs = tmp_path / "state" / "logs"
    logs.mkdir(parents=True)
    (logs / "gateway.jsonl").write_text('{"event": "x", "level": "info"}\n')
    r = tidegate(config, "logs", "-n", "-5")
    assert r.returncode == 2 and "must be >= 0" in r.stderr
    _clean(r)


# ---- service install ----------------------------------------------------------------------


def test_service_install_into_an_unwritable_dir_is_one_error_line(config, tmp_path):
    r = tidegate(config, "service", "install", "--user", "--dest-dir", "/proc/nope")
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("error: cannot write /proc/nope: ") and r.stderr.count("\n") == 1
    _clean(r)


def test_service_install_prints_steps_not_log_lines(config, tmp_path):
    r = tidegate(config, "service", "install", "--user", "--dest-dir", str(tmp_path / "units"))
    assert r.returncode == 0 and "next steps:" in r.stdout
    assert (tmp_path / "units" / "tidegate.service").is_file()
    assert "service_unit_written" not in r.stdout + r.stderr
    _clean(r)


# ---- timeline output into a closed pipe ---------------------------------------------------


async def _long_timeline(db: Path) -> None:
    tl = await Timeline.open_sqlite(db)
    await tl.init_timeline("s1", "agent:main:main")
    for i in range(2000):  # ~250 KB of output: far more than a pipe buffer holds
        await tl.append_event("s1", "USER_INPUT", {"text": f"message {i} " * 12})
    await tl.close()


@pytest.mark.parametrize("action", ["replay", "show"])
def test_timeline_into_a_closed_pipe_exits_quietly(config, tmp_path, action):
    asyncio.run(_long_timeline(tmp_path / "state" / "timeline.db"))
    # `tidegate timeline replay s1 | head -1`
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "--config", str(config),
                             "timeline", action, "s1"], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"Session agent:main:main")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert err == ""


@pytest.mark.parametrize("args", [["completion", "bash"], ["doctor", "--json"],
                                  ["config", "validate"]])
def test_any_command_into_a_closed_pipe_exits_quietly(config, args):
    # `tidegate doctor --json | head -1` where head has already gone: every write fails
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([sys.executable, "-m", "gateway.cli", "--config", str(config),
                            *args], cwd=ROOT, env=_env(), stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert (r.returncode, r.stderr) == (0, "")


# ---- pairing ------------------------------------------------------------------------------


def test_pairing_approve_prints_no_log_lines(config, tmp_path):
    req = PairingStore(tmp_path / "state", SYSTEM_CLOCK).request("telegram", "default", "42",
                                                                 "Bob")
    r = tidegate(config, "pairing", "approve", "telegram", req.code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "approved telegram sender 42 (Bob) on account default"
    assert "pairing_approved" not in r.stdout + r.stderr
    r = tidegate(config, "pairing", "revoke", "telegram", "42")
    assert r.returncode == 0 and "pairing_revoked" not in r.stdout + r.stderr
    _clean(r)


@pytest.mark.parametrize("args", [
    ("approve", "nosuch", "CODE"),
    ("approve", "Webchat", "CODE"),
    ("revoke", "nosuch", "42"),
    ("list", "--channel", "nosuch"),
    ("list", "--approved", "--channel", "nosuch"),
])
def test_pairing_rejects_unknown_channels_without_creating_files(config, tmp_path, args):
    r = tidegate(config, "pairing", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "invalid channel name" in r.stderr and "telegram" in r.stderr
    _clean(r)
    pairing = tmp_path / "state" / "pairing"
    assert not pairing.exists() or not list(pairing.iterdir())
