"""``backup`` edge cases an operator meets: a ``backup.dir`` that would hollow out the
archive, a refused ``create`` that is no failed backup, default names that never
collide, rotation that only touches what the schedule made."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.cli.main import main as cli
from gateway.config.load import ConfigError, parse_config
from tests.helpers import base_config


def _state(tmp: Path) -> Path:
    state = tmp / "state"
    (state / "agents" / "main" / "sessions").mkdir(parents=True)
    (state / "agents" / "main" / "sessions" / "s.jsonl").write_text("{}\n")
    return state


def _config(tmp: Path, state: Path, **backup) -> str:
    path = tmp / "config.yaml"
    data = base_config(state)
    if backup:
        data["backup"] = backup
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("sub", ["agents/main/sessions", "workspace", ".", "backups/x"])
def test_a_backup_dir_inside_the_state_dir_is_refused_naming_it(tmp_path, sub):
    state = _state(tmp_path)
    data = base_config(state, backup={"dir": str(state / sub)})
    with pytest.raises(ConfigError) as err:
        parse_config(data, env={})
    problem = next(p for p in err.value.problems if p.startswith("backup.dir:"))
    # the state dir itself is told as such, not as a folder "inside" it
    assert ("is the state dir" in problem) == (sub == ".")


@pytest.mark.parametrize("where", ["default", "outside"])
def test_the_default_backup_dir_and_one_outside_are_fine(tmp_path, where):
    state = _state(tmp_path)
    folder = state / "backups" if where == "default" else tmp_path / "elsewhere"
    assert parse_config(base_config(state, backup={"dir": str(folder)}), env={}).config


def test_the_cli_names_backup_dir_and_makes_nothing(tmp_path, capsys):
    state = _state(tmp_path)
    cfg = _config(tmp_path, state, dir=str(state / "agents" / "main" / "sessions"))
    assert cli(["--config", cfg, "backup", "create"]) != 0
    assert "backup.dir" in capsys.readouterr().err
    assert sorted(p.name for p in (state / "agents" / "main" / "sessions").iterdir()) \
        == ["s.jsonl"]


def test_a_refused_create_is_no_failed_backup(tmp_path, capsys):
    import json
    state = _state(tmp_path)
    cfg = _config(tmp_path, state)
    dest = tmp_path / "b.tar.gz"
    assert cli(["--config", cfg, "backup", "create", "--to", str(dest)]) == 0
    good = json.loads((state / "backup-last.json").read_text())
    assert good["ok"] is True
    for to in (dest, state / "agents" / "inside.tar.gz"):  # exists; inside the state dir
        assert cli(["--config", cfg, "backup", "create", "--to", str(to)]) == 1
    assert "inside the state dir" in capsys.readouterr().err
    assert json.loads((state / "backup-last.json").read_text()) == good
    (tmp_path / "afile").write_text("not a directory")
    assert cli(["--config", cfg, "backup", "create", "--to",
                str(tmp_path / "afile" / "x.tgz")]) == 1  # attempted: that one counts
    assert json.loads((state / "backup-last.json").read_text())["ok"] is False


def _loaded(tmp: Path):
    state = _state(tmp)
    return parse_config(base_config(state), env={}), state


def test_concurrent_creates_without_to_get_names_of_their_own(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from gateway.backup.check import verify_archive
    from gateway.backup.service import run_backup
    loaded, state = _loaded(tmp_path)
    now = 1_767_225_600.0  # all in the same second: the same default name
    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(lambda _: run_backup(loaded.config, state, now=now), range(4)))
    names = sorted(m.path.name for m in made)
    assert len(set(names)) == 4, names
    assert all(verify_archive(m.path).ok for m in made)


def test_a_default_name_taken_while_the_backup_ran_is_not_a_failure(tmp_path):
    from gateway.backup.names import free_path
    from gateway.backup.service import run_backup
    loaded, state = _loaded(tmp_path)
    now = 1_767_225_600.0
    taken = free_path(state / "backups", now, scheduled=False)

    def other_backup_lands(_state, _items):  # another `backup create` finishing first
        taken.write_bytes(b"the other backup")

    made = run_backup(loaded.config, state, now=now, cut=other_backup_lands)
    assert made.path.name == taken.name.replace(".tar.gz", "-1.tar.gz")
    assert taken.read_bytes() == b"the other backup"


def test_rotation_keeps_a_hand_made_archive_with_a_scheduled_looking_name(tmp_path):
    from gateway.backup.service import run_backup
    state = _state(tmp_path)
    loaded = parse_config(base_config(state, backup={"keep": 1}), env={})
    folder = state / "backups"
    by_hand = folder / "tidegate-backup-20200101T000000Z.tar.gz"  # oldest of all
    run_backup(loaded.config, state, dest=by_hand)  # `backup create --to` that name
    now = 1_767_225_600.0
    first = run_backup(loaded.config, state, scheduled=True, now=now)
    second = run_backup(loaded.config, state, scheduled=True, now=now + 86400)
    assert sorted(p.name for p in folder.glob("*.tar.gz")) == sorted(
        [by_hand.name, second.path.name])
    assert not first.path.exists()  # the schedule's own older one went
