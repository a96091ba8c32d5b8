"""Crash and shutdown lose no accepted message (issue 8 items 1-3): the real daemon as a
subprocess, the fake platforms and the fake model in threads, ``kill -9`` / SIGTERM, then
a restart that must answer every accepted message exactly once."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from gateway.journal.resume import INTERRUPTED_NOTICE
from tests.channel_harness import chat_requests
from tests.fakes import fake_telegram
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import GatewayProcess, base_config
from tests.test_gateway_channels import (  # noqa: F401 - platforms is a fixture
    TG_USER,
    control,
    delivered,
    platforms,
    three_channel_config,
    wait,
)

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning"),
]


@pytest.fixture
def tg_model():
    """The fake model and a fake Telegram, each in its own thread."""
    model = FakeOpenAI.start_in_thread()
    tg = fake_telegram.start_in_thread()
    yield model, tg
    tg.stop()
    model.stop()


def events(gp: GatewayProcess, name: str) -> list[dict]:
    try:
        return [line for line in gp.log_lines() if line.get("event") == name]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def telegram_only(state, model, tg, **gateway) -> dict:
    cfg = base_config(state, model.base_url, channels={
        "telegram": {"enabled": True, "token": tg.fake.token,
                     "api_base_url": f"{tg.url}/bot", "poll_timeout": 1,
                     "dm_policy": "open"}})
    cfg["gateway"].update(gateway)
    return cfg


def tg_texts(tg) -> list[str]:
    return [m["text"] for m in tg.call(tg.fake.bot_messages, TG_USER)]


def test_kill9_with_50_queued_messages_loses_none_and_doubles_none(tmp_path,
                                                                   platforms):  # noqa: F811
    model, tg, slack, dc = platforms
    model.server.latency = 5.0  # no turn finishes before the kill
    state = tmp_path / "state"
    gp = GatewayProcess(tmp_path, three_channel_config(state, model, tg, slack, dc)).start()
    sent: dict[str, list[str]] = {"telegram": [], "slack": [], "discord": []}
    try:
        for i in range(50):
            platform = ("telegram", "slack", "discord")[i % 3]
            text = f"{platform} message {i}"
            sent[platform].append(text)
            if platform == "telegram":
                tg.call(tg.fake.inject_message, text, chat_id=TG_USER, user_id=TG_USER)
            elif platform == "slack":
                control(slack.url, "event", {"kind": "dm", "text": text})
            else:
                control(dc.url, "dm", {"text": text})
        wait(lambda: len(events(gp, "inbound_queued")) == 50, timeout=30,
             what="all 50 messages accepted")
        time.sleep(1.0)
    finally:
        gp.kill9()
    assert delivered(tg, slack, dc) == {"telegram": [], "slack": [], "discord": []}

    model.server.latency = 0.0
    gp.start()
    try:
        want = {p: sorted(f"echo: {t}" for t in texts) for p, texts in sent.items()}
        try:
            wait(lambda: {p: sorted(v) for p, v in delivered(tg, slack, dc).items()} == want,
                 timeout=60, what="every accepted message answered")
        except AssertionError:
            assert {p: sorted(v) for p, v in delivered(tg, slack, dc).items()} == want
        time.sleep(1.5)  # a late duplicate (Telegram redelivers unconfirmed updates) shows
        got = delivered(tg, slack, dc)
        for platform, texts in got.items():
            assert Counter(texts) == Counter(want[platform]), platform
        resumed = events(gp, "journal_entry_resumed")
        assert len(resumed) == 50
        assert Counter(r["action"] for r in resumed) == {"run": 47, "rerun": 3}
        assert {r["session_key"] for r in resumed} == {
            f"agent:main:telegram:dm:{TG_USER}", "agent:main:slack:dm:u0alice",
            f"agent:main:discord:dm:{dc.fake.alice.id}"}
        asked = Counter(json.dumps(r["messages"][-1]) for r in chat_requests(model.server))
        # only the 3 turns in flight at the kill reached the model again; none came twice
        assert len(asked) == 50 and sorted(asked.values()) == [1] * 47 + [2] * 3
    finally:
        assert gp.stop() == 0


def test_kill9_mid_turn_is_answered_after_restart(tmp_path, tg_model):
    model, tg = tg_model
    state = tmp_path / "state"
    gp = GatewayProcess(tmp_path, telegram_only(state, model, tg)).start()
    try:
        model.server.script_hang()  # the model call takes "30 s"
        tg.call(tg.fake.inject_message, "which planet is red?", chat_id=TG_USER,
                user_id=TG_USER)
        wait(lambda: chat_requests(model.server), what="the turn in flight")
    finally:
        gp.kill9()
    assert tg_texts(tg) == []
    model.server.script_text("Mars.")
    gp.start()
    try:
        wait(lambda: tg_texts(tg) == ["Mars."], what="the reply after the restart")
        [resumed] = events(gp, "journal_entry_resumed")
        assert resumed["action"] == "rerun"
        assert resumed["session_key"] == f"agent:main:telegram:dm:{TG_USER}"
        users = [m for m in chat_requests(model.server)[-1]["messages"]
                 if m["role"] == "user"]
        assert [m["content"] for m in users] == ["which planet is red?"]  # once
        time.sleep(1.0)
        assert tg_texts(tg) == ["Mars."]
    finally:
        assert gp.stop() == 0


def test_sigterm_past_the_grace_reruns_the_cancelled_turn(tmp_path, tg_model):
    model, tg = tg_model
    state = tmp_path / "state"
    gp = GatewayProcess(tmp_path, telegram_only(state, model, tg,
                                                shutdown_grace="300ms")).start()
    model.server.script_hang()  # a 120 s model call during `systemctl restart`
    tg.call(tg.fake.inject_message, "long question", chat_id=TG_USER, user_id=TG_USER)
    wait(lambda: chat_requests(model.server), what="the turn in flight")
    assert gp.stop() == 0
    [cancelled] = events(gp, "turn_cancelled_at_shutdown")
    assert cancelled["session_key"] == f"agent:main:telegram:dm:{TG_USER}"
    model.server.script_text("the long answer")
    gp.start()
    try:
        wait(lambda: tg_texts(tg) == ["the long answer"], what="the re-run turn's reply")
        [resumed] = events(gp, "journal_entry_resumed")
        assert (resumed["action"], resumed["session_key"]) == (
            "rerun", cancelled["session_key"])
    finally:
        assert gp.stop() == 0


def test_kill9_during_a_side_effecting_tool_continues_without_repeating_it(tmp_path, tg_model):
    model, tg = tg_model
    state = tmp_path / "state"
    gp = GatewayProcess(tmp_path, telegram_only(state, model, tg)).start()
    try:
        model.server.script_tool_call("exec",
                                      {"command": "echo run >> ran.txt && sleep 30"})
        tg.call(tg.fake.inject_message, "log a run", chat_id=TG_USER, user_id=TG_USER)
        ran = wait(lambda: next(state.rglob("ran.txt"), None), what="the tool running")
        wait(lambda: ran.read_text() == "run\n", what="the tool's effect")
    finally:
        gp.kill9()  # the tool call now has no result in the transcript
    model.server.script_text("Logged one run.")
    gp.start()
    try:
        wait(lambda: tg_texts(tg) == [INTERRUPTED_NOTICE, "Logged one run."],
             what="the notice, then the continued reply")
        key = f"agent:main:telegram:dm:{TG_USER}"
        [resumed] = events(gp, "journal_entry_resumed")
        assert (resumed["action"], resumed["tools"], resumed["session_key"]) == (
            "continue", ["exec"], key)
        [repaired] = events(gp, "transcript_tool_pairs_repaired")
        assert repaired["session_key"] == key and repaired["results_added"] == 1
        body = json.dumps(chat_requests(model.server)[-1])
        assert "exec" in body and "not run again" in body  # the system event
        assert ran.read_text() == "run\n"  # the tool did not run twice
    finally:
        assert gp.stop() == 0


async def test_a_turn_finished_before_the_crash_is_answered_from_its_transcript(
        tmp_path, tg_model):
    """The process died after the turn wrote its answer to the transcript and before the
    reply's delivery mark (journal: accept + start). The resumed turn used to call the
    model again on a transcript already ending with that answer (the checker's fake model
    answered an empty turn: the message never got its reply); now the answer in the
    transcript is delivered and the model is not asked again."""
    import asyncio

    from tests.helpers import running_gateway
    model, tg = tg_model
    state = tmp_path / "state"
    cfg = telegram_only(state, model, tg)
    cfg["channels"]["telegram"]["streaming"] = {"mode": "off"}
    model.server.push({"type": "text", "text": "the answer, written before the crash"})
    async with running_gateway(cfg):
        tg.call(tg.fake.inject_message, "question", chat_id=TG_USER, user_id=TG_USER)
        for _ in range(500):
            if tg_texts(tg):
                break
            await asyncio.sleep(0.02)
    assert tg_texts(tg) == ["the answer, written before the crash"]
    path = state / "intake-journal.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    assert [r["op"] for r in lines][:2] == ["accept", "start"]
    assert lines[-1]["op"] == "done"
    # the journal as the crash left it: the reply's marks never written
    path.write_text("".join(json.dumps(r) + "\n" for r in lines[:2]))
    model.server.push({"type": "text", "text": "a second model call (wrong)"})
    async with running_gateway(cfg):
        for _ in range(500):
            if len(tg_texts(tg)) > 1:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # a second model call would show by now
    assert tg_texts(tg) == ["the answer, written before the crash"] * 2
    assert len(chat_requests(model.server)) == 1
