"""``backup create`` never replaces what is at its destination (a device node, an
existing archive) unless asked, and never backs up a state dir that is not there."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from gateway.backup.check import verify_archive
from gateway.cli.main import main as cli
from tests.helpers import base_config


def _config(tmp: Path, state: Path) -> str:
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(state)))
    return str(path)


def _state(tmp: Path) -> Path:
    state = tmp / "state"
    (state / "agents").mkdir(parents=True)
    (state / "agents" / "a.txt").write_text("a")
    return state


def test_an_existing_file_at_to_is_kept_unless_force(tmp_path, capsys):
    cfg = _config(tmp_path, _state(tmp_path))
    dest = tmp_path / "bk" / "b1.tar.gz"
    assert cli(["--config", cfg, "backup", "create", "--to", str(dest)]) == 0
    first = dest.read_bytes()
    capsys.readouterr()
    assert cli(["--config", cfg, "backup", "create", "--to", str(dest)]) == 1
    err = capsys.readouterr().err
    assert "exists: not replaced" in err and "--force" in err
    assert dest.read_bytes() == first
    assert sorted(p.name for p in dest.parent.iterdir()) == ["b1.tar.gz"]  # no leftovers
    assert cli(["--config", cfg, "backup", "create", "--to", str(dest), "--force"]) == 0
    assert verify_archive(dest).ok and os.stat(dest).st_mode & 0o777 == 0o600


def test_a_non_regular_file_at_to_is_never_replaced(tmp_path, capsys):
    """A FIFO (as a device node would be), a directory and a symlink stay what they are,
    --force or not; no staging copy is made beside them."""
    cfg = _config(tmp_path, _state(tmp_path))
    where = tmp_path / "out"
    where.mkdir()
    os.mkfifo(where / "fifo")
    (where / "adir").mkdir()
    (where / "target").write_text("the symlink's target")
    (where / "link").symlink_to(where / "target")
    for name, kind in (("fifo", "not a regular file"), ("adir", "a directory"),
                       ("link", "a symlink")):
        for force in ([], ["--force"]):
            assert cli(["--config", cfg, "backup", "create", "--to", str(where / name),
                        *force]) == 1
            assert f"exists and is {kind}" in capsys.readouterr().err
    assert sorted(p.name for p in where.iterdir()) == ["adir", "fifo", "link", "target"]
    assert (where / "fifo").is_fifo() and (where / "link").is_symlink()
    assert (where / "target").read_text() == "the symlink's target"


def test_a_missing_state_dir_is_refused_and_nothing_is_created(tmp_path, capsys):
    state = tmp_path / "nostate"
    cfg = _config(tmp_path, state)
    assert cli(["--config", cfg, "backup", "create"]) == 1
    err = capsys.readouterr().err
    assert "the state dir does not exist" in err and str(state) in err
    assert not state.exists()
    assert cli(["--config", cfg, "backup", "create", "--to", str(tmp_path / "b.tgz")]) == 1
    assert not state.exists() and not (tmp_path / "b.tgz").exists()
    state.mkdir()  # there but empty: no gateway's state either
    assert cli(["--config", cfg, "backup", "create", "--to", str(tmp_path / "b.tgz")]) == 1
    assert "holds no files of a gateway" in capsys.readouterr().err
    assert not (tmp_path / "b.tgz").exists() and not (state / "backups").exists()


def test_the_system_unit_lets_the_gateway_write_its_backup_dir(tmp_path, capsys):
    """ProtectSystem=strict makes all but ReadWritePaths read-only: a backup.dir (and a
    timeline.path) outside the state dir is added, so scheduled backups can be written."""
    import pwd

    from gateway.cli.service import install
    from gateway.config.load import load_config
    state = tmp_path / "state"
    cfg = base_config(state, backup={"dir": str(tmp_path / "mnt" / "backup")},
                      timeline={"path": str(tmp_path / "db" / "timeline.db")})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    me = pwd.getpwuid(os.getuid()).pw_name
    assert install(load_config(str(path)), user_mode=False, dest_dir=str(tmp_path / "units"),
                   user_name=me, allow_root=True) == 0
    unit = (tmp_path / "units" / "tidegate.service").read_text().splitlines()
    assert f"ReadWritePaths={state} -{tmp_path}/mnt/backup -{tmp_path}/db" in unit
    cfg["backup"] = {"dir": str(state / "backups")}  # inside the state dir: nothing added
    del cfg["timeline"]
    path.write_text(yaml.safe_dump(cfg))
    assert install(load_config(str(path)), user_mode=False, dest_dir=str(tmp_path / "units"),
                   user_name=me, allow_root=True) == 0
    unit = (tmp_path / "units" / "tidegate.service").read_text().splitlines()
    assert f"ReadWritePaths={state}" in unit
