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


@pytest.mark.parametrize("mode", ["block"])
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


def test_kill9_while_only_a_draft_shows_reruns_the_turn(tmp_path, tg_model):  # noqa: F811
    """A private chat's partial stream grows as a draft, which lapses when the process
    dies: nothing lasting is in the chat, so no reply mark is written before it and the
    restart re-runs the turn: the user gets the whole reply once, no cut-off notice.
    (Before: marked before the draft, the message got only the notice and never a reply,
    the checker's lost reply.)"""
    model, tg = tg_model
    state = tmp_path / "state"
    gp = GatewayProcess(tmp_path, config(state, model, tg, "partial")).start()
    try:
        model.server.push({"type": "text", "text": "".join(PIECES), "pieces": PIECES,
                           "piece_delay": 0.5})
        tg.call(tg.fake.inject_message, "tell me a long story", chat_id=TG_USER,
                user_id=TG_USER)
        wait(lambda: any(FIRST in t for t in tg.call(lambda: list(tg.fake.drafts.values()))),
             what="the first streamed draft")
    finally:
        gp.kill9()
    assert [r for r in journal_lines(state) if r["op"] == "reply"] == []
    assert bot_texts(tg) == []
    model.server.push({"type": "text", "text": "The whole answer."})
    gp.start()
    try:
        wait(lambda: bot_texts(tg) == ["The whole answer."], what="the re-run turn's reply")
        time.sleep(1.0)
        assert bot_texts(tg) == ["The whole answer."]
        assert len(chat_requests(model.server)) == 2
    finally:
        assert gp.stop() == 0


def test_kill9_after_the_turn_while_its_draft_waits_posts_the_reply(tmp_path, tg_model):  # noqa: F811
    """The turn is done and its draft shows the whole reply, the final post waits out the
    stream's interval: marked ``draft`` (nothing lasting in the chat), a restart posts the
    reply once without asking the model again (before: the cut-off notice, no reply)."""
    model, tg = tg_model
    state = tmp_path / "state"
    cfg = config(state, model, tg, "partial")
    cfg["channels"]["telegram"]["streaming"]["min_interval"] = 30
    gp = GatewayProcess(tmp_path, cfg).start()
    try:
        model.server.push({"type": "text", "text": "All of it."})
        tg.call(tg.fake.inject_message, "short one", chat_id=TG_USER, user_id=TG_USER)
        wait(lambda: [r.get("stream") for r in journal_lines(state) if r["op"] == "reply"]
             == ["draft"], what="the draft mark")
    finally:
        gp.kill9()
    assert bot_texts(tg) == []
    gp.start()
    try:
        wait(lambda: bot_texts(tg) == ["All of it."], what="the reply posted after restart")
        time.sleep(1.0)
        assert bot_texts(tg) == ["All of it."]
        assert len(chat_requests(model.server)) == 1  # the turn was not re-run
    finally:
        assert gp.stop() == 0
