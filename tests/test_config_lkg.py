"""The last-known-good config (gateway/config/lkg.py): kept once a config has served
``config.lkg_after`` (text as written: ${VAR} references, never values), used by a start
whose config is invalid under ``config.on_invalid: lkg`` (serving, and saying so in
status), shown by ``tidegate config diff-lkg``."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import time

import pytest
import yaml

from gateway.cli.main import main
from gateway.config.lkg import load_or_lkg
from gateway.config.load import ConfigError, load_config
from gateway.service.daemon import Gateway
from runtime.clock import FakeClock
from tests.helpers import GatewayProcess, base_config

SECRET = "sk-spare-0123456789abcdef"
ENV = {"SPARE_KEY": SECRET}


def config_text(state, extra: str = "") -> str:
    cfg = base_config(state, config={"lkg_after": "60s", "on_invalid": "lkg"})
    cfg["models"] = {"providers": {"spare": {"api": "openai", "base_url":
                                             "http://127.0.0.1:9/v1",
                                             "api_key": "${SPARE_KEY}"}}}
    return "# my gateway\n" + yaml.safe_dump(cfg) + extra


def cli(path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--config", str(path), *args])
    return code, out.getvalue(), err.getvalue()


async def test_a_config_that_served_is_kept_as_written(tmp_path):
    state = tmp_path / "state"
    path = tmp_path / "config.yaml"
    path.write_text(config_text(state))
    clock = FakeClock()
    gw = Gateway(load_config(path, ENV), clock=clock)
    await gw.start()
    lkg = state / "config.lkg.yaml"
    try:
        await clock.advance(59)
        assert not lkg.exists()  # not yet served long enough
        await clock.advance(2)
        await gw.lkg.saved.wait()
        assert lkg.read_text() == path.read_text()  # comments and ${VAR} kept
        assert "${SPARE_KEY}" in lkg.read_text() and SECRET not in lkg.read_text()
        assert oct(lkg.stat().st_mode & 0o777) == "0o600"
        # a reloaded config becomes last-known-good only after it served lkg_after too
        path.write_text(config_text(state, "# v2\n"))
        gw.lkg.saved.clear()
        await gw.reload(load_config(path, ENV))
        await clock.advance(30)
        assert "# v2" not in lkg.read_text()
        await clock.advance(31)
        await gw.lkg.saved.wait()
        assert lkg.read_text() == path.read_text()
    finally:
        await gw.stop()


def test_an_invalid_start_uses_the_lkg_only_when_told(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    path = tmp_path / "config.yaml"
    good = config_text(state)
    (state / "config.lkg.yaml").write_text(good)
    path.write_text(good.replace("mode: followup", "mode: sideways"))
    loaded = load_or_lkg(path, ENV)
    assert loaded.text == good and loaded.path == path
    assert loaded.rejected.startswith(f"{path}: messages.queue.mode: Input should be")
    assert loaded.config.models.providers["spare"].api_key == SECRET  # resolved from env
    # YAML that does not even parse (config.yaml in the state dir): the state dir is the
    # file's own, on_invalid is read from the last-known-good copy
    inside = state / "config.yaml"
    inside.write_text(good + "  : : [\n")
    assert load_or_lkg(inside, ENV).rejected.startswith(f"{inside}: <yaml>:")
    # refuse (the default) keeps refusing, with or without a copy
    path.write_text(good.replace("on_invalid: lkg", "on_invalid: refuse").replace(
        "mode: followup", "mode: sideways"))
    with pytest.raises(ConfigError) as exc:
        load_or_lkg(path, ENV)
    assert exc.value.problems[0].startswith("messages.queue.mode")
    # on_invalid missing from a broken file that parses: refuse (the default), although
    # the copy says lkg
    path.write_text(good.replace("  on_invalid: lkg\n", "").replace("mode: followup",
                                                                     "mode: sideways"))
    assert "on_invalid" not in path.read_text()
    with pytest.raises(ConfigError) as exc:
        load_or_lkg(path, ENV)
    assert exc.value.problems[0].startswith("messages.queue.mode")
    assert main(["--config", str(path), "gateway"]) == 2
    (state / "config.lkg.yaml").unlink()
    path.write_text(good.replace("mode: followup", "mode: sideways"))
    with pytest.raises(ConfigError) as exc:
        load_or_lkg(path, ENV)
    assert "no last-known-good config at" in exc.value.problems[-1]


def test_diff_lkg(tmp_path):
    state = tmp_path / "state"
    path = tmp_path / "config.yaml"
    good = config_text(state)
    path.write_text(good.replace("mode: followup", "mode: sideways"))
    code, _, err = cli(path, "config", "diff-lkg")
    assert code == 2 and "no last-known-good config at" in err
    state.mkdir()
    (state / "config.lkg.yaml").write_text(good)
    code, out, _ = cli(path, "config", "diff-lkg")  # works on the broken file
    assert code == 1
    assert "-    mode: followup\n" in out and "+    mode: sideways\n" in out
    path.write_text(good)
    code, out, _ = cli(path, "config", "diff-lkg")
    assert code == 0 and "no difference" in out


def test_a_broken_edit_and_restart_keeps_serving_on_the_lkg(tmp_path):
    state = tmp_path / "state"
    gp = GatewayProcess(tmp_path, {"gateway": {"state_dir": str(state)}},
                        env={"SPARE_KEY": SECRET})
    good = config_text(state)
    state.mkdir()
    (state / "config.lkg.yaml").write_text(good)  # what an earlier run kept
    gp.config_path.write_text(good.replace("mode: followup", "mode: sideways"))
    gp.start()

    def problems() -> list[str]:
        code, out, err = cli(gp.config_path, "status", "--json")  # works on the broken file
        assert code == 0, err
        return [p for p in json.loads(out)["problems"] if p.startswith("config:")]
    try:
        [problem] = problems()
        assert str(gp.config_path) in problem and "messages.queue.mode" in problem
        assert "last-known-good" in problem
        code, out, _ = cli(gp.config_path, "agent", "-m", "still here?", "--json", "-q")
        assert code == 0 and "You said: still here?" in json.loads(out)["reply"]
        logged = [e for e in gp.log_lines() if e["event"] == "config_rejected_running_lkg"]
        assert [e["level"] for e in logged] == ["error"]  # once per start
        code, out, _ = cli(gp.config_path, "status")
        assert "a new start (systemctl restart) runs on the last-known-good config" in out
        assert "would refuse this file" not in out
        gp.config_path.write_text(good)  # fixed, then reloaded: the problem goes
        gp.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while problems():
            assert time.monotonic() < deadline, "the problem stayed after the reload"
            time.sleep(0.1)
    finally:
        assert gp.stop() == 0
