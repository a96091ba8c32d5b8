"""A last-known-good copy that names another state dir (the dir was restored elsewhere,
or moved) never starts a gateway on that other dir: restore leaves it out, and a start
with ``on_invalid: lkg`` refuses to use such a copy."""

from __future__ import annotations

import shutil

import pytest
import yaml

from gateway.backup.archive import create_backup
from gateway.backup.check import restore
from gateway.config.lkg import load_or_lkg
from gateway.config.load import ConfigError
from tests.helpers import base_config


def _text(state) -> str:
    cfg = base_config(state, config={"lkg_after": "1s", "on_invalid": "lkg"})
    return "# kept\n" + yaml.safe_dump(cfg)


def test_restore_leaves_out_an_lkg_copy_of_another_state_dir(tmp_path):
    old = tmp_path / "old"
    (old / "agents").mkdir(parents=True)
    (old / "agents" / "a.txt").write_text("a")
    (old / "config.lkg.yaml").write_text(_text(old))
    made = create_backup(old, tmp_path / "b.tgz")
    out = restore(made.path, tmp_path / "new")
    assert out.ok and not (tmp_path / "new" / "config.lkg.yaml").exists()
    assert [n for n in out.notes if f"names the state dir {old}" in n]
    shutil.rmtree(old)  # the same path again (the host came back): the copy stays
    out = restore(made.path, old)
    assert out.ok and out.notes == [] and (old / "config.lkg.yaml").read_text() == _text(old)


def test_a_start_never_runs_on_an_lkg_copy_naming_another_state_dir(tmp_path):
    moved, gone = tmp_path / "moved", tmp_path / "gone"
    moved.mkdir()
    (moved / "config.lkg.yaml").write_text(_text(gone))  # written before the move
    broken = tmp_path / "config.yaml"
    broken.write_text(_text(moved).replace("followup", "bogus"))
    with pytest.raises(ConfigError) as exc:
        load_or_lkg(str(broken), {})
    assert any("names another state dir" in p and str(gone) in p
               for p in exc.value.problems)
    assert not gone.exists()
    (moved / "config.lkg.yaml").write_text(_text(moved))  # a copy of its own dir is used
    loaded = load_or_lkg(str(broken), {})
    assert loaded.state_dir == moved and loaded.rejected
