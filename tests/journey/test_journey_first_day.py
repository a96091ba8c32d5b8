"""Stage 1 of the operator journey: from ``tidegate setup`` to a paired Telegram chat.

``setup --non-interactive`` (secrets only in the setup command's environment) -> the
gateway in the foreground, started as setup says, with nothing exported -> ``doctor`` ->
``agent -m`` -> a Telegram stranger gets a pairing code, the operator approves it, and the
conversation runs. Each step checks what the operator sees: exit codes, output, files,
and the messages the fake Telegram received.
"""

from __future__ import annotations

import re

from tests.fakes.fake_telegram import DEFAULT_TOKEN
from tests.journey.driver import wait_for
from tests.journey.steps import API_KEY, setup_telegram, start_as_printed

STRANGER = 424242

def test_setup_start_doctor_agent_and_a_paired_telegram_chat(operator, telegram, model):
    command = setup_telegram(operator, telegram, model)
    fg = start_as_printed(operator, command)  # nothing exported: the env file is read

    doctor = operator.run("doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "error" not in doctor.stdout.lower().replace("0 errors", "")
    assert API_KEY not in doctor.stdout + doctor.stderr

    answer = operator.ok("agent", "-m", "hello from the shell")
    assert "echo: hello from the shell" in answer.stdout

    tg = telegram.fake
    telegram.call(tg.inject_message, "hi, who are you?", chat_id=STRANGER,
                  user_id=STRANGER, first_name="Ann")
    notice = wait_for(lambda: tg.bot_messages(STRANGER), what="the pairing code")[0]
    code = re.search(r"pairing code is (\w+)", notice["text"]).group(1)
    assert f"tidegate pairing approve telegram {code}" in notice["text"]
    pending = operator.json("pairing", "list")
    assert [(p["sender_id"], p["code"]) for p in pending] == [(str(STRANGER), code)]
    approved = operator.ok("pairing", "approve", "telegram", code)
    assert f"approved telegram sender {STRANGER} (Ann)" in approved.stdout

    telegram.call(tg.inject_message, "what can you do?", chat_id=STRANGER,
                  user_id=STRANGER, first_name="Ann")
    wait_for(lambda: any(m["text"] == "echo: what can you do?"
                         for m in tg.bot_messages(STRANGER)), what="the answer on Telegram")
    asked = [m["content"] for r in model.server.requests if r.json
             for m in r.json.get("messages", []) if m.get("role") == "user"]
    assert not any("who are you" in str(c) for c in asked), "an unpaired stranger reached the model"

    # the env file is the default for every command; --env-file names another one, before
    # or after the command
    alt = operator.home / "alt.env"
    alt.write_text("TELEGRAM_BOT_TOKEN=999:wrong\nOPENAI_API_KEY=sk-other\n")
    assert "probe telegram: ok" in operator.ok("channels", "status", "--probe").stdout
    for argv in (("--env-file", str(alt), "channels", "status", "--probe"),
                 ("channels", "status", "--probe", "--env-file", str(alt))):
        probe = operator.run(*argv)
        assert probe.returncode == 1 and "FAILED" in probe.stdout, (argv, probe.stdout)
    assert "999:wrong" not in probe.stdout + probe.stderr

    status = operator.ok("status")
    assert "telegram" in status.stdout
    assert fg.stop() == 0
    log = fg.output()
    assert API_KEY not in log and DEFAULT_TOKEN not in log
