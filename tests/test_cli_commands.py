"""Issue 14 "CLI": completion, sessions reset, gateway status|stop|restart, service
uninstall, models list, channels status --probe — the real CLI against the real gateway,
the fake model and the fake Telegram server."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
import yaml

from tests.fakes import fake_telegram
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import GatewayProcess, base_config
from tests.test_cli_operator import tidegate


@pytest.fixture
def fake_model():
    running = FakeOpenAI.start_in_thread()
    yield running
    running.stop()


def test_bash_completion_completes_commands_options_and_choices():
    script = tidegate("completion", "bash").stdout

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        r = subprocess.run(["bash", "-c", (f"{script}\nCOMP_WORDS=(tidegate {line}); "
                            f"COMP_CWORD={len(words)}; _tidegate; "
                            "printf '%s\\n' \"${COMPREPLY[@]}\"")],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert complete("ses") == ["sessions"]
    assert set(complete("sessions", "")) >= {"list", "show", "reset"}
    assert "--every" in complete("cron", "add", "--")
    assert set(complete("completion", "")) >= {"bash", "zsh", "fish"}
    assert "--since" in complete("logs", "--")


def test_zsh_and_fish_scripts_cover_the_same_tree():
    zsh = tidegate("completion", "zsh").stdout
    fish = tidegate("completion", "fish").stdout
    assert zsh.startswith("#compdef tidegate") and "complete -F _tidegate tidegate" in zsh
    assert "complete -c tidegate -n __fish_use_subcommand -a sessions" in fish
    assert "__fish_seen_subcommand_from cron" in fish and "-l every" in fish
    r = tidegate("completion", "tcsh")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_sessions_reset_and_gateway_status_stop_restart(tmp_path, fake_model):
    gp = GatewayProcess(tmp_path, base_config(tmp_path / "state",
                                              fake_model.base_url)).start()
    try:
        fake_model.server.script_text("hi")
        first = gp.agent("hello")
        out = json.loads(gp.cli("sessions", "reset", first["session_key"], "--json").stdout)
        assert out["old_session_id"] == first["session_id"]
        assert out["session_id"] != first["session_id"]
        old = gp.state_dir / "agents" / "main" / "sessions" / f"{first['session_id']}.jsonl"
        assert old.exists()  # the old transcript stays
        r = gp.cli("sessions", "reset", "agent:main:nope", check=False)
        assert r.returncode == 1 and "no session agent:main:nope" in r.stderr

        r = gp.cli("gateway", "status")
        assert r.returncode == 0 and f"pid {gp.proc.pid}" in r.stdout
        r = gp.cli("gateway", "restart", timeout=90)
        assert r.returncode == 0, r.stderr
        new_pid = json.loads((gp.state_dir / "gateway.json").read_text())["pid"]
        assert new_pid != gp.proc.pid and f"started gateway (pid {new_pid})" in r.stdout
        assert gp.proc.wait(timeout=30) == 0  # the old one drained and exited cleanly
        fake_model.server.script_text("after restart")
        assert gp.agent("still there?")["reply"] == "after restart"
        good = gp.config_path.read_text()
        gp.config_path.write_text(good + "media: {album_wait: soon}\n")  # an edit gone wrong
        r = gp.cli("gateway", "restart", check=False, timeout=90)
        assert r.returncode == 2 and "media.album_wait" in r.stderr  # refused, still running
        r = gp.cli("gateway", "status")  # status and stop read only the gateway section
        assert r.returncode == 0 and f"pid {new_pid}" in r.stdout
        gp.config_path.write_text("- " + good.replace("\n", "\n  "))  # not a mapping at all
        r = gp.cli("gateway", "stop", check=False)  # not the default state dir's gateway
        assert r.returncode == 2 and "expected a mapping of sections" in r.stderr
        gp.config_path.write_text(good + "media: {album_wait: soon}\n")
        r = gp.cli("gateway", "stop", timeout=90)
        assert r.returncode == 0 and f"stopped gateway (pid {new_pid})" in r.stdout
        assert not (gp.state_dir / "gateway.json").exists()
        r = gp.cli("gateway", "stop", check=False)
        assert r.returncode == 1 and "not running" in r.stderr
    finally:
        if gp.proc.poll() is None:
            gp.stop()


def test_service_uninstall_stops_disables_and_removes_the_unit(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "systemctl.calls"
    fake = bin_dir / "systemctl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"gateway": {"state_dir": str(tmp_path / "state")}}))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    units = tmp_path / "units"
    assert tidegate("service", "install", "--user", "--dest-dir", str(units), "--config",
                    str(cfg), env=env).returncode == 0
    r = tidegate("service", "uninstall", "--user", "--dest-dir", str(units), "--config",
                 str(cfg), env=env)
    assert r.returncode == 0, r.stderr
    assert not (units / "tidegate.service").exists()
    assert calls.read_text().splitlines() == ["--user disable --now tidegate.service",
                                              "--user daemon-reload"]
    assert (tmp_path / "state" / "tidegate.env").exists()  # secrets kept
    r = tidegate("service", "uninstall", "--user", "--dest-dir", str(units), env=env)
    assert r.returncode == 1 and "no unit at" in r.stderr


def test_models_list(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "gateway": {"state_dir": str(tmp_path / "s")},
        "models": {"providers": {"openai": {"api": "openai", "api_key": "${K:-x}"}}},
        "agents": {"defaults": {"model": {"primary": "openai/gpt-4o",
                                          "fallbacks": ["openai/gpt-4o-mini"]}},
                   "list": [{"id": "main"}, {"id": "ops", "model": "echo/diagnostic"}]}}))
    rows = json.loads(tidegate("models", "list", "--json", "--config", str(cfg)).stdout)
    assert [(r["agent"], r["role"], r["model"]) for r in rows] == [
        ("main", "primary", "openai/gpt-4o"), ("main", "fallback 1", "openai/gpt-4o-mini"),
        ("ops", "primary", "echo/diagnostic")]
    text = tidegate("models", "list", "--config", str(cfg)).stdout
    assert "openai/gpt-4o" in text and "2.5/10" in text


def test_channels_probe_checks_slack_and_discord_tokens_live(tmp_path):
    # Slack's auth.test and Discord's GET /users/@me, each with a right and a wrong token
    from tests.fakes import fake_discord, fake_slack
    sl, dc = fake_slack.start_in_thread(), fake_discord.start_in_thread()
    try:
        def probe(slack_token: str, discord_token: str) -> tuple[int, dict]:
            cfg = base_config(tmp_path / "state", "http://127.0.0.1:9/v1")
            cfg["channels"] = {
                "slack": {"enabled": True, "bot_token": slack_token, "app_token": "xapp-1",
                          "api_base_url": sl.api_url},
                "discord": {"enabled": True, "token": discord_token,
                            "api_base_url": dc.api_url}}
            path = tmp_path / "c.yaml"
            path.write_text(yaml.safe_dump(cfg))
            r = tidegate("channels", "status", "--probe", "--json", "--config", str(path))
            return r.returncode, json.loads(r.stdout)["probes"]
        code, probes = probe(sl.fake.bot_token, dc.fake.token)
        assert code == 0 and probes["slack"]["ok"] and probes["discord"]["ok"], probes
        assert "Fake Team" in probes["slack"]["detail"]
        code, probes = probe("xoxb-wrong", "not-the-bot")
        assert code == 1 and not probes["slack"]["ok"] and not probes["discord"]["ok"]
        assert probes["slack"]["detail"] == "invalid_auth", probes
        assert "token rejected" in probes["discord"]["detail"], probes
    finally:
        sl.stop()
        dc.stop()


def test_channels_status_probe_checks_tokens_live(tmp_path, fake_model):
    tg = fake_telegram.start_in_thread()
    try:
        cfg = base_config(tmp_path / "state", fake_model.base_url)
        cfg["channels"] = {"telegram": {"enabled": True, "token": "${TG_TOKEN}",
                                        "api_base_url": f"{tg.url}/bot"}}
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(cfg))
        env_file = tmp_path / "tidegate.env"
        env_file.write_text(f"TG_TOKEN={fake_telegram.DEFAULT_TOKEN}\n")
        r = tidegate("channels", "status", "--probe", "--config", str(path), "--env-file",
                     str(env_file))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "probe telegram: ok — bot @" in r.stdout
        env_file.write_text("TG_TOKEN=999:wrong\n")
        r = tidegate("channels", "status", "--probe", "--json", "--config", str(path),
                     "--env-file", str(env_file))
        assert r.returncode == 1
        assert json.loads(r.stdout)["probes"]["telegram"]["ok"] is False
        r = tidegate("channels", "status", "--config", str(path))
        assert r.returncode == 1 and "not running" in r.stderr
    finally:
        tg.stop()
