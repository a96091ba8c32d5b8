"""Stage: a heartbeat alert reaches the operator's Telegram chat once, and a restart of the
gateway does not send the same alert again (identical alert text within 24 h is not
delivered twice: the delivery ledger is a file in the state dir, kept across restarts).
"""

from __future__ import annotations

import json

from tests.journey.driver import wait_for
from tests.journey.steps import setup_telegram, start_as_printed

OWNER = 1001
ALERT = "ALERT: the backup disk is 97% full"


def _beats(operator) -> list[dict]:
    r = operator.ok("logs", "--event", "heartbeat", "--json", "-n", "50")
    return [json.loads(line) for line in r.stdout.splitlines()
            if line.strip() and json.loads(line).get("event") == "heartbeat"]


def test_an_alert_is_not_repeated_after_a_restart(operator, telegram, model):
    command = setup_telegram(operator, telegram, model)
    operator.edit_config(lambda cfg: cfg["agents"]["defaults"].update(
        heartbeat={"every": "30m", "target": f"telegram:{OWNER}"}))
    workspace = operator.state / "workspace" / "main"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "HEARTBEAT.md").write_text("# Checks\n\n- Tell me when a disk is almost full.\n")
    model.server.responder = lambda body: ALERT if "HEARTBEAT" in json.dumps(body) else None

    fg = start_as_printed(operator, command)
    operator.ok("heartbeat", "now")
    tg = telegram.fake
    wait_for(lambda: [m for m in tg.bot_messages(OWNER) if m["text"] == ALERT],
             what="the alert on Telegram")
    wait_for(lambda: [b for b in _beats(operator) if b["outcome"] == "delivered"],
             what="the beat logged as delivered")
    assert fg.stop() == 0

    fg = start_as_printed(operator, command)
    operator.ok("heartbeat", "now")
    beats = wait_for(lambda: [b for b in _beats(operator) if b["outcome"] != "delivered"],
                     what="the second beat logged")
    assert [(b["outcome"], b["reason"]) for b in beats] == [("duplicate",
                                                              "same_text_within_24h")]
    assert [m["text"] for m in tg.bot_messages(OWNER)] == [ALERT]
    assert fg.stop() == 0
