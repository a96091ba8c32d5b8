"""A streamed reply and ``kill -9`` (issue 13 + issue 8): the intake journal's ``reply``
mark is written before the stream's first piece is posted, so a restart never re-runs the
turn and never posts a second copy; the user gets one notice that the reply may be cut
off. The real daemon as a subprocess, the fake Telegram and the fake model in threads."""

from __future__ import annotations

import json
import time

import pytest

from gateway.journal.resume import STREAM_CUT_NOTICE
from tests.channel_harness import chat_requests
from tests.helpers import GatewayProcess, base_config
from tests.test_gateway_channels import TG_USER, wait
from tests.test_intake_journal_crash import tg_model  # noqa: F401 - a fixture

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning"),
]

FIRST = "The first paragraph of a long answer."
PIECES = [FIRST + "\n\n"] + [f"word{i} " for i in range(40)]


def config(state, model, tg, mode: str) -> dict:
    return base_config(state, model.base_url, channels={
        "telegram": {"enabled": True, "token": tg.fake.token,
                     "api_base_url": f"{tg.url}/bot", "poll_timeout": 1,
                     "dm_policy": "open",
                     "streaming": {"mode": mode, "min_interval": 0.05}}})


def journal_lines(state) -> list[dict]:
    path = state / "intake-journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bot_texts(tg) -> list[str]:
    return [m["text"] for m in tg.call(tg.fake.bot_messages, TG_USER)]


@pytest.mark.parametrize("mode", ["block", "partial"])
def test_kill9_mid_stream_posts_no_second_copy(tmp_path, tg_model, mode):  # noqa: F811
    model, tg = tg_model
    state = tmp_path / "state"
    gp = GatewayProcess(tmp_path, config(state, model, tg, mode)).start()
    try:
        model.server.push({"type": "text", "text": "".join(PIECES), "pieces": PIECES,
                           "piece_delay": 0.5})
        tg.call(tg.fake.inject_message, "tell me a long story", chat_id=TG_USER,
                user_id=TG_USER)
        if mode == "block":  # the first paragraph is its own, lasting message
            wait(lambda: bot_texts(tg) == [FIRST], what="the first streamed piece posted")
        else:  # a private chat grows as a draft
            wait(lambda: any(FIRST in t for t in tg.call(lambda: list(tg.fake.drafts.values()))),
                 what="the first streamed draft")
    finally:
        gp.kill9()
    marks = journal_lines(state)
    [reply] = [r for r in marks if r["op"] == "reply"]
    assert reply["stream"] is True and reply["text"] == ""
    posted_before = bot_texts(tg)
    asked_before = len(chat_requests(model.server))
    assert asked_before == 1

    gp.start()
    try:
        wait(lambda: bot_texts(tg) == posted_before + [STREAM_CUT_NOTICE],
             what="one notice after the restart")
        time.sleep(1.5)  # a second copy (a re-run turn) would show by now
        assert bot_texts(tg) == posted_before + [STREAM_CUT_NOTICE]
        assert len(chat_requests(model.server)) == asked_before  # the turn was not re-run
        [abandoned] = [r for r in gp.log_lines()
                       if r.get("event") == "journal_entry_abandoned"]
        assert abandoned["delivery"] == "stream_cut"
        assert abandoned["session_key"] == f"agent:main:telegram:dm:{TG_USER}"
    finally:
        assert gp.stop() == 0


def test_finished_stream_is_not_resent_after_a_restart(tmp_path, tg_model):  # noqa: F811
    """The done mark follows the finished stream: a later restart has nothing to do."""
    model, tg = tg_model
    state = tmp_path / "state"
    gp = GatewayProcess(tmp_path, config(state, model, tg, "block")).start()
    try:
        model.server.push({"type": "text", "text": "One.\n\nTwo.", "pieces": ["One.\n\n", "Two."],
                           "piece_delay": 0.2})
        tg.call(tg.fake.inject_message, "count", chat_id=TG_USER, user_id=TG_USER)
        wait(lambda: bot_texts(tg) == ["One.", "Two."], what="the streamed reply")
        wait(lambda: [r["op"] for r in journal_lines(state)][-1] == "done", what="done mark")
        ops = [r["op"] for r in journal_lines(state)]
        assert ops.index("reply") < ops.index("done")
    finally:
        gp.kill9()
    gp.start()
    try:
        time.sleep(1.5)
        assert bot_texts(tg) == ["One.", "Two."]
    finally:
        assert gp.stop() == 0
