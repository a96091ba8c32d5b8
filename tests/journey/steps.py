"""Steps several journey stages share: the setup wizard with Telegram and the fake model,
and starting the gateway the way setup says to."""

from __future__ import annotations

import shlex
import stat

from tests.fakes.fake_telegram import DEFAULT_TOKEN
from tests.journey.driver import free_port

API_KEY = "sk-journey-0123456789abcdef"


def setup_telegram(operator, telegram, model) -> str:
    """Run the wizard non-interactively; returns the start command it printed."""
    r = operator.run(
        "setup", "--non-interactive", "--provider", "openai", "--model", "fake-model",
        "--base-url", model.base_url, "--api-key-env", "OPENAI_API_KEY",
        "--timezone", "Europe/Berlin", "--telegram-token-env", "TELEGRAM_BOT_TOKEN",
        "--telegram-api-base-url", f"{telegram.url}/bot", "--dm-policy", "pairing",
        env={"OPENAI_API_KEY": API_KEY, "TELEGRAM_BOT_TOKEN": DEFAULT_TOKEN})
    assert r.returncode == 0, r.stderr
    assert "ok: openai/fake-model answered" in r.stdout
    assert "ok: telegram bot @" in r.stdout
    [start] = [line.split("start it:", 1)[1] for line in r.stdout.splitlines()
               if "start it:" in line]
    env_file = operator.state / "tidegate.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert f"OPENAI_API_KEY={API_KEY}" in env_file.read_text()
    text = operator.config_path.read_text()
    assert API_KEY not in text and DEFAULT_TOKEN not in text and "${OPENAI_API_KEY}" in text
    # the operator picks a port (hermetic: never the default one)
    port = free_port()
    operator.edit_config(lambda cfg: cfg["gateway"].update(port=port))
    return start.split("(")[0].strip()


def start_as_printed(operator, command: str):
    """Start the gateway with the command setup printed (``tidegate ... gateway``)."""
    argv = shlex.split(command)
    assert argv[0] == "tidegate" and argv[-1] == "gateway", command
    return operator.start_gateway(*argv[1:-1])
