"""A message re-run after a crash whose user message is in the transcript, but with a
later message's turn after it (that later message ran first: rows taken over out of
order on PostgreSQL, or a done mark lost with the process), is written to the
transcript again, so the model answers it. Before, the re-run counted it as written
and called the model with the transcript as it was: its newest user message was the
later one, the re-run answered that message a second time and its own message got no
reply (the fault-injection run's ``replied-unseen m5`` with ``reply-twice m24``)."""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from gateway.journal.resume import logged_messages
from gateway.journal.store import FILE_NAME as JOURNAL_FILE
from gateway.journal.store import IntakeJournal
from runtime.clock import SYSTEM_CLOCK
from tests.channel_harness import chat_requests, last_user_text, until
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER = 5252
KEY = f"agent:main:telegram:dm:{USER}"


def _config(tmp_path, model, tg) -> dict:
    return base_config(tmp_path / "state", model.base_url, channels={"telegram": {
        "enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
        "poll_timeout": 1, "dm_policy": "open"}})


def _reopen_as_started(state, text: str) -> str:
    """Journal the message ``text`` again as a turn that had started when the process
    died (its earlier entry is done: the state a takeover leaves when a row's done mark
    was lost, or when a later row of its session ran first). Returns the new entry id."""
    lines = [json.loads(x) for x in (state / JOURNAL_FILE).read_text().splitlines()]
    [work] = [r["work"] for r in lines if r["op"] == "accept" and r["work"]["text"] == text]
    journal = IntakeJournal(state / JOURNAL_FILE, SYSTEM_CLOCK)
    journal.load()
    entry = journal.accept(KEY, work)
    journal.started([entry.id], "run-dead")
    journal.close()
    return entry.id


async def test_a_rerun_behind_a_later_turn_answers_its_own_message(tmp_path, model, tg):
    cfg, state = _config(tmp_path, model, tg), tmp_path / "state"
    async with running_gateway(cfg) as gw:
        model.script_error(500)  # the first turn writes its message, then fails
        tg.inject_message("first question", chat_id=USER, user_id=USER)
        await until(lambda: len(gw.journal.outcomes) == 1, what="the first outcome")
        model.script_text("second answer")
        tg.inject_message("second question", chat_id=USER, user_id=USER)
        await until(lambda: len(gw.journal.outcomes) == 2, what="the second outcome")
        await until(lambda: not gw.lanes.is_running(KEY), what="the lane to idle")
    entry = _reopen_as_started(state, "first question")
    before = len(chat_requests(model))
    model.script_text("first answer")
    with capture_logs() as logs:
        async with running_gateway(cfg) as gw:
            await until(lambda: entry in gw.journal.outcomes.rows, what="the outcome")
            await until(lambda: not gw.lanes.is_running(KEY), what="the lane to idle")
            assert gw.journal.outcomes.rows[entry]["outcome"] == "replied"
    [again] = [r for r in logs if r["event"] == "resumed_message_written_again"]
    assert again["session_key"] == KEY and len(again["message_ids"]) == 1
    [rerun] = chat_requests(model)[before:]
    assert last_user_text(rerun) == "first question"  # not "second question" again
    texts = [m["text"] for m in tg.bot_messages(USER)]
    assert texts[-1] == "first answer" and texts.count("second answer") == 1, texts


def _user(mid: str | None) -> tuple[dict, int]:
    msg = {"role": "user", "content": "x", **({"messageId": mid} if mid else {})}
    return {"message": msg}, 0


def _assistant() -> tuple[dict, int]:
    return {"message": {"role": "assistant", "content": [{"type": "text", "text": "y"}]}}, 0


def test_only_the_transcript_tail_counts_as_written():
    # oldest first; logged_messages reads newest first
    def tail(entries, ids):
        return logged_messages(iter(reversed(entries)), ids)
    steered = [_user("a"), _user("b"), _assistant()]  # one turn took both
    assert tail(steered, ["a", "b"]) == ({"a", "b"}, set())
    later = [_user("a"), _user("b"), _assistant()]  # b's own turn ran after a's
    assert tail(later, ["a"]) == (set(), {"a"})
    cron = [_user("a"), _user(None), _assistant()]  # a cron prompt's turn ran since
    assert tail(cron, ["a"]) == (set(), {"a"})
    again = [_user("a"), _user("b"), _assistant(), _user("a")]  # written again already
    assert tail(again, ["a"]) == ({"a"}, set())
    assert tail([_user("b"), _assistant()], ["a"]) == (set(), set())  # never written
