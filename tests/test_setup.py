"""``tidegate setup`` (issue 14): non-interactive end to end and interactive through a pty
(pexpect), with live checks against the fake model and the fake Telegram server."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pexpect
import yaml

from channels.registry import channel_names
from tests.fakes import fake_telegram
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import ROOT

KEY = "sk-setup-test-0123456789"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    env.update(extra)
    return env


def test_non_interactive_setup_end_to_end(tmp_path):
    model = FakeOpenAI.start_in_thread(api_key=KEY)
    tg = fake_telegram.start_in_thread()
    state = tmp_path / "state"
    try:
        model.server.script_text("OK")
        args = [sys.executable, "-m", "gateway.cli", "setup", "--non-interactive",
                "--state-dir", str(state), "--provider", "openai", "--model", "fake-model",
                "--base-url", model.base_url, "--api-key-env", "QA_KEY",
                "--timezone", "Europe/Berlin", "--telegram-token-env", "QA_TG",
                "--telegram-api-base-url", f"{tg.url}/bot", "--dm-policy", "allowlist",
                "--allow-from", "telegram:123456789"]
        env = _env(QA_KEY=KEY, QA_TG=fake_telegram.DEFAULT_TOKEN)
        r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        # the wizard's own lines only: no log records of the provider/platform clients
        assert r.stdout.splitlines()[:3] == ["ok: openai/fake-model answered",
                                             "ok: telegram bot @tidegate_test_bot",
                                             (f"wrote {state / 'config.yaml'} and "
                                             f"{state / 'tidegate.env'} (mode 0600)")]
        assert r.stderr == ""
        assert model.server.requests[-1].json["max_tokens"] == 1
        cfg = yaml.safe_load((state / "config.yaml").read_text())
        assert cfg["models"]["providers"]["openai"]["api_key"] == "${QA_KEY}"
        assert cfg["channels"]["telegram"]["token"] == "${QA_TG}"
        assert cfg["channels"]["telegram"]["dm_policy"] == "allowlist"
        assert cfg["channels"]["telegram"]["allow_from"] == ["123456789"]
        assert cfg["agents"]["defaults"]["user_timezone"] == "Europe/Berlin"
        env_file = state / "tidegate.env"
        assert env_file.stat().st_mode & 0o777 == 0o600
        assert f"QA_KEY={KEY}" in env_file.read_text()
        assert KEY not in (state / "config.yaml").read_text()
        # the result validates with the env file, as the unit would run it
        v = subprocess.run([sys.executable, "-m", "gateway.cli", "config", "validate",
                            "--config", str(state / "config.yaml"), "--env-file",
                            str(env_file)], capture_output=True, text=True, cwd=ROOT,
                           env=_env(), timeout=60)
        assert v.returncode == 0, v.stderr
        # a misspelt timezone fails before the provider is asked anything
        asked = len(model.server.requests)
        bad_tz = [*args[:args.index("--timezone") + 1], "Europe/Berlni",
                  *args[args.index("--timezone") + 2:], "--force"]
        r = subprocess.run(bad_tz, capture_output=True, text=True, cwd=ROOT, env=env,
                           timeout=60)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr == "error: --timezone: unknown IANA timezone 'Europe/Berlni'\n"
        assert len(model.server.requests) == asked
        # a second run refuses to overwrite; a wrong token is refused with the reason
        r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env,
                           timeout=60)
        assert r.returncode == 2 and "--force" in r.stderr
        model.server.script_text("OK")
        r = subprocess.run([*args, "--force"], capture_output=True, text=True, cwd=ROOT,
                           env=_env(QA_KEY=KEY, QA_TG="1:wrong"), timeout=60)
        assert r.returncode == 1 and "the telegram settings did not work" in r.stderr
    finally:
        tg.stop()
        model.stop()


def test_interactive_setup_through_a_pty(tmp_path):
    model = FakeOpenAI.start_in_thread(api_key=KEY)
    state = tmp_path / "state"
    try:
        child = pexpect.spawn(sys.executable, ["-m", "gateway.cli", "setup", "--state-dir",
                                               str(state)], cwd=str(ROOT), env=_env(),
                              encoding="utf-8", timeout=60)
        child.logfile_read = seen = io.StringIO()
        child.expect(r"Model provider \[openai/anthropic/echo\]")
        child.sendline("openai")
        child.expect("Model")
        child.sendline("fake-model")
        child.expect("Base URL")
        child.sendline(model.base_url)
        child.expect(r"API key \(hidden\)")
        child.sendline("sk-wrong-key-000000")  # refused by the fake: asked again
        child.expect("that did not work")
        child.expect(r"another API key, change the base URL, or give up \[key/url/quit\]")
        child.sendline("")  # Enter: another key
        model.server.script_text("OK")
        child.expect(r"API key \(hidden\)")
        child.sendline(KEY)
        child.expect("ok: openai/fake-model answered")
        child.expect("Your timezone")
        child.sendline("Asia/Tokio")  # a typo is asked again, the checked key kept
        child.expect("unknown IANA timezone 'Asia/Tokio', e.g. Europe/Berlin")
        child.expect("Your timezone")
        child.sendline("Asia/Tokyo")
        for platform in channel_names():  # every installed platform plugin, in order
            child.expect(f"Connect {platform}")
            child.sendline("no")
        child.expect("wrote ")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
        # between the prompts only the wizard's text: no (coloured) log records
        assert "provider_created" not in seen.getvalue()
        assert "model_call" not in seen.getvalue() and "\x1b[" not in seen.getvalue()
        cfg = yaml.safe_load((state / "config.yaml").read_text())
        assert cfg["agents"]["defaults"] == {"model": "openai/fake-model",
                                             "user_timezone": "Asia/Tokyo"}
        assert "channels" not in cfg
        assert f"OPENAI_API_KEY={KEY}" in (state / "tidegate.env").read_text()
    finally:
        model.stop()


def test_non_interactive_setup_checks_slack_and_discord_tokens_live(tmp_path):
    """Slack ``auth.test`` and Discord ``/users/@me`` against the fakes: the right tokens
    are written as ``${NAME}`` references, a wrong one of either platform stops setup
    with exit 1 and the platform's reason."""
    from tests.fakes import fake_discord, fake_slack
    sl, dc = fake_slack.start_in_thread(), fake_discord.start_in_thread()
    state = tmp_path / "state"
    try:
        args = [sys.executable, "-m", "gateway.cli", "setup", "--non-interactive",
                "--state-dir", str(state), "--provider", "echo", "--timezone", "UTC",
                "--slack-bot-token-env", "QA_SB", "--slack-app-token-env", "QA_SA",
                "--slack-api-base-url", sl.api_url.rstrip("/"),
                "--discord-token-env", "QA_DC", "--discord-api-base-url", dc.api_url]
        good = {"QA_SB": sl.fake.bot_token, "QA_SA": sl.fake.app_token,
                "QA_DC": dc.fake.token}
        r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT,
                           env=_env(**good), timeout=120)
        assert r.returncode == 0, r.stderr
        assert "ok: slack bot " in r.stdout and "ok: discord bot " in r.stdout, r.stdout
        cfg = yaml.safe_load((state / "config.yaml").read_text())
        assert cfg["channels"]["slack"]["bot_token"] == "${QA_SB}"
        assert cfg["channels"]["slack"]["app_token"] == "${QA_SA}"
        assert cfg["channels"]["discord"]["token"] == "${QA_DC}"
        env_text = (state / "tidegate.env").read_text()
        assert f"QA_SB={sl.fake.bot_token}" in env_text and f"QA_DC={dc.fake.token}" in env_text
        r = subprocess.run([*args, "--force"], capture_output=True, text=True, cwd=ROOT,
                           env=_env(**{**good, "QA_SB": "xoxb-wrong"}), timeout=60)
        assert r.returncode == 1 and "the slack settings did not work: invalid_auth" in r.stderr, \
            r.stderr
        r = subprocess.run([*args, "--force"], capture_output=True, text=True, cwd=ROOT,
                           env=_env(**{**good, "QA_DC": "wrong-discord"}), timeout=60)
        assert r.returncode == 1 and "the discord settings did not work: HTTP 401" in r.stderr, \
            r.stderr
        assert "wrong-discord" not in r.stdout + r.stderr
    finally:
        dc.stop()
        sl.stop()


def test_bad_answers_are_refused_naming_the_flag_before_any_check(tmp_path, capsys):
    """An email allow_from entry that is neither an address nor @domain, a port out of
    range and a base URL that is not a URL stop a non-interactive run with exit 2 (nothing
    is probed, nothing written); config validation refuses the same allow_from."""
    from gateway.cli.main import main as cli_main
    from gateway.config.load import ConfigError, parse_config
    state = tmp_path / "state"
    base = ["setup", "--non-interactive", "--state-dir", str(state), "--timezone", "UTC"]
    email = [*base, "--provider", "echo", "--email-address", "bot@tide.test",
             "--email-imap-host", "127.0.0.1", "--email-imap-password-env", "HOME"]
    cases = {
        "--allow-from email:notanaddress: 'notanaddress': not an address "
        "(alice@example.org), a domain (@example.org or *@example.org) or *: it needs "
        "exactly one @, no other wildcard and no trailing dot":
            [*email, "--allow-from", "email:notanaddress"],
        "--email-imap-port 99999: Input should be less than or equal to 65535":
            [*email, "--email-imap-port", "99999"],
        "--base-url: 'openai' is not an http:// or https:// URL":
            [*base, "--provider", "openai", "--model", "m", "--base-url", "openai",
             "--api-key-env", "HOME"]}
    for message, args in cases.items():
        assert cli_main(args) == 2
        assert message in capsys.readouterr().err
    assert not state.exists()
    try:
        parse_config({"channels": {"email": {"allow_from": ["@ok.test", "pairing"]}}},
                     "test", env={})
        raise AssertionError("accepted")
    except ConfigError as exc:
        assert exc.problems == ["channels.email.allow_from: 'pairing': not an address "
                                "(alice@example.org), a domain (@example.org or "
                                "*@example.org) or *: it needs exactly one @, no other "
                                "wildcard and no trailing dot"]


def test_the_wizard_asks_a_bad_base_url_again_and_offers_it_after_a_failed_key(
        tmp_path, monkeypatch, capsys):
    """At the prompt: 'openai' as base URL is asked again; a key that fails against an
    unreachable URL offers key / url / quit, and 'url' lets the URL be fixed."""
    import getpass

    from gateway.cli.main import main as cli_main
    model = FakeOpenAI.start_in_thread(api_key=KEY)
    try:
        model.server.script_text("OK")
        typed = iter(["openai", "fake-model", "openai", "http://127.0.0.1:9/v1", "url",
                      model.base_url])
        keys = iter(["sk-wrong", KEY])
        monkeypatch.setattr("builtins.input", lambda prompt="": next(typed, ""))
        monkeypatch.setattr(getpass, "getpass", lambda prompt="": next(keys))
        state = tmp_path / "state"
        assert cli_main(["setup", "--state-dir", str(state)]) == 0
    finally:
        model.stop()
    out = capsys.readouterr().out
    assert "'openai' is not an http:// or https:// URL" in out
    assert "that did not work" in out and "ok: openai/fake-model answered" in out
    cfg = yaml.safe_load((state / "config.yaml").read_text())
    assert cfg["models"]["providers"]["openai"]["base_url"] == model.base_url


def test_prompts_say_what_an_empty_answer_does(tmp_path, monkeypatch):
    """No prompt shows "(none)": one with a default shows it, one without says what Enter
    does ("(Enter: the provider's own)") or that an answer is required."""
    import argparse
    import getpass

    from gateway.cli.main import main as cli_main
    from gateway.cli.setup.answers import Answers
    prompts: list[str] = []
    model = FakeOpenAI.start_in_thread(api_key=KEY)
    try:
        model.server.script_text("OK")
        answers = {"Model provider": "openai", "Model": "fake-model",
                   "Base URL": model.base_url}

        def typed(prompt: str = "") -> str:
            prompts.append(prompt)
            return answers.get(prompt.split(" (")[0].split(" [")[0], "")
        monkeypatch.setattr("builtins.input", typed)
        monkeypatch.setattr(getpass, "getpass", lambda prompt="": KEY)
        assert cli_main(["setup", "--state-dir", str(tmp_path / "state")]) == 0
    finally:
        model.stop()
    assert "Base URL (Enter: the provider's own): " in prompts
    assert "Your timezone (UTC): " in prompts
    ans = Answers(argparse.Namespace(non_interactive=False))
    answers = {"Display name": "", "Bot address": "bot@tide.test"}
    assert ans.ask("Display name", "display_name", blank="leave it unset") == ""
    assert ans.ask("Bot address", "address", blank=None) == "bot@tide.test"
    assert prompts[-2:] == ["Display name (Enter: leave it unset): ",
                            "Bot address (required): "]
    assert not [p for p in prompts if "(none)" in p]
