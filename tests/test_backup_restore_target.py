"""``backup restore`` onto a target that refuses writes (a full disk: here a file size
limit, RLIMIT_FSIZE, in a CLI subprocess) or that it cannot prepare (a directory it may
not chmod) names the target, exits 1 and leaves it empty, never blaming the archive."""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.backup.archive import create_backup
from tests.helpers import base_config

ROOT = Path(__file__).resolve().parent.parent


def _limit_file_size() -> None:
    # writes beyond 256 KiB fail with EFBIG (Python ignores SIGXFSZ), as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))


def _archive(tmp: Path) -> tuple[Path, Path]:
    """An archive holding a 1 MiB incompressible transcript; a config file."""
    state = tmp / "state"
    (state / "agents" / "main" / "sessions").mkdir(parents=True)
    (state / "agents" / "main" / "sessions" / "big.bin").write_bytes(os.urandom(1 << 20))
    archive = tmp / "b.tar.gz"
    create_backup(state, archive)
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump(base_config(state)))
    return archive, cfg


def test_a_target_that_refuses_writes_is_named_not_the_archive(tmp_path):
    archive, cfg = _archive(tmp_path)
    target = tmp_path / "restored"
    argv = [sys.executable, "-m", "gateway.cli", "--config", str(cfg), "backup", "restore",
            str(archive), "--state-dir", str(target)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          preexec_fn=_limit_file_size)
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith(f"error: restore failed: {target}: cannot be written: File too "
                          "large (while writing agents/main/sessions/big.bin)"), err
    assert "damaged" not in proc.stderr and "Traceback" not in proc.stderr
    assert list(target.iterdir()) == []


def _without_fowner() -> None:
    # root without CAP_FOWNER (dropped from the bounding set before exec) may chmod only
    # what it owns, as any user
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(24, 3, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_FOWNER
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to own the target as nobody)")
def test_an_empty_target_it_cannot_chmod_is_named_exit_1(tmp_path):
    """The target is an empty directory of another user (mode 0777: writable, yet only
    its owner may chmod it)."""
    archive, cfg = _archive(tmp_path)
    target = tmp_path / "target"
    target.mkdir()
    os.chmod(target, 0o777)
    os.chown(target, 65534, 65534)
    argv = [sys.executable, "-m", "gateway.cli", "--config", str(cfg), "backup", "restore",
            str(archive), "--state-dir", str(target)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          preexec_fn=_without_fowner)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: restore failed: {target}: cannot be made private (mode 0700): "
        "Operation not permitted"), proc.stderr
    assert list(target.iterdir()) == []
