"""Stage: a private reminder added from the CLI never reaches the teammate who spoke last.

Two Telegram users are paired; the second one chats most recently. ``cron add --at`` from
the CLI has no conversation, so the job delivers nowhere until ``--to`` names a target:
``cron add``, ``cron list`` and ``cron run`` say so, and the teammate receives nothing.
Once the operator names their own chat, the reminder goes there and only there.
"""

from __future__ import annotations

import re

from tests.journey.driver import wait_for
from tests.journey.steps import setup_telegram, start_as_printed

OWNER, TEAMMATE = 1001, 2002


def _pair(operator, telegram, user: int, name: str) -> None:
    tg = telegram.fake
    telegram.call(tg.inject_message, "hello", chat_id=user, user_id=user, first_name=name)
    notice = wait_for(lambda: tg.bot_messages(user), what=f"{name}'s pairing code")[0]
    code = re.search(r"pairing code is (\w+)", notice["text"]).group(1)
    operator.ok("pairing", "approve", "telegram", code)
    telegram.call(tg.inject_message, f"hi, I am {name}", chat_id=user, user_id=user,
                  first_name=name)
    wait_for(lambda: any(m["text"] == f"echo: hi, I am {name}" for m in tg.bot_messages(user)),
             what=f"the answer to {name}")


def test_a_cli_reminder_delivers_nowhere_until_told_and_never_to_the_last_speaker(
        operator, telegram, model):
    fg = start_as_printed(operator, setup_telegram(operator, telegram, model))
    _pair(operator, telegram, OWNER, "Olga")
    _pair(operator, telegram, TEAMMATE, "Tom")  # the most recent chat
    seen_by_teammate = len(telegram.fake.bot_messages(TEAMMATE))

    added = operator.ok("cron", "add", "--name", "stretch", "--at", "20m", "--session",
                        "isolated", "--message", "remind me to stretch")
    job = re.search(r"added cron job (\w+)", added.stdout).group(1)
    assert "delivers nowhere" in added.stdout and f"cron edit {job} --to" in added.stdout
    [listed] = [j for j in operator.json("cron", "list") if j["id"] == job]
    assert (listed["delivery"], listed["deliver_to"]) == ("none", None)
    assert "nowhere" in operator.ok("cron", "list").stdout

    ran = operator.ok("cron", "run", job)
    assert "not delivered: the job has no delivery target" in ran.stdout
    assert len(telegram.fake.bot_messages(TEAMMATE)) == seen_by_teammate

    edited = operator.ok("cron", "edit", job, "--to", f"telegram:{OWNER}")
    assert f"delivers to telegram:{OWNER}" in edited.stdout
    model.server.responder = lambda body: ("Time to stretch!"
                                           if "stretch" in str(body) else None)
    operator.ok("cron", "run", job)
    wait_for(lambda: any(m["text"] == "Time to stretch!"
                         for m in telegram.fake.bot_messages(OWNER)), what="the reminder")
    assert len(telegram.fake.bot_messages(TEAMMATE)) == seen_by_teammate
    assert fg.stop() == 0
