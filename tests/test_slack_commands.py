"""Slack slash commands answered ephemerally at their ``response_url`` (issue 13
"Commands, natively registered"): the real SlackChannel (slack-bolt Socket Mode) against the
fake Slack's response URLs (tests/fakes/fake_slack/responses.py). Whole-gateway cases (socket and
HTTP mode, lane commands) are in tests/test_gateway_slack.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from structlog.testing import capture_logs

from channels.base import InboundMessage, OutboundMessage
from channels.slack.commands import URL_TTL, allowed_response_url
from runtime.clock import FakeClock
from tests.channel_harness import started_slack
from tests.fakes.fake_slack import FakeSlack

pytestmark = pytest.mark.timeout(20)


async def until(pred: Any, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
    return value


def collect(inbox: list) -> Any:
    async def on_message(m: InboundMessage) -> None:
        inbox.append(m)
    return on_message


def notice(to: str, text: str, answers: str | None = None) -> OutboundMessage:
    return OutboundMessage(channel="slack", to=to, text=text, kind="notice", answers=answers)


def posted(fake: FakeSlack) -> list[dict[str, Any]]:
    return [c for c in fake.sent if c["method"] == "chat.postMessage"]


def test_only_slack_hooks_or_the_api_host_are_called():
    api = "http://127.0.0.1:5000/api/"
    assert allowed_response_url("https://hooks.slack.com/commands/T1/2/x", api)
    assert allowed_response_url("http://127.0.0.1:5000/_response/ab", api)
    assert not allowed_response_url("http://hooks.slack.com/commands/x", api)  # not https
    assert not allowed_response_url("https://evil.example/hooks.slack.com", api)
    assert not allowed_response_url("http://127.0.0.1:6000/x", api)  # another port
    assert not allowed_response_url(None, api)


async def test_answer_is_ephemeral_split_and_once(slack):  # tests/conftest.py
    fake = slack
    clock, inbox = FakeClock(), []
    ch = await started_slack(fake, clock, collect(inbox))
    try:
        env = await fake.push_command("/usage", channel="C0GENERAL", user="U0BOB")
        [msg] = await until(lambda: inbox)
        assert (msg.text, msg.chat_type, msg.group_id) == ("/usage", "channel", "C0GENERAL")
        reply = await ch.send(OutboundMessage(channel="slack", to="C0GENERAL", text="a reply"))
        assert reply.ok and len(posted(fake)) == 1  # a turn's reply is not the answer
        other = await ch.send(notice("C0GENERAL", "(The gateway restarted.)"))
        assert other.ok and len(posted(fake)) == 2  # a notice answering nothing: not it
        long = "\n\n".join(f"line {i} " + "y" * 90 for i in range(60))  # > 4000 chars
        answer = await ch.send(notice("C0GENERAL", long, answers=msg.message_id))
        record = fake.responses.of(env["payload"]["response_url"])
        assert answer.ok and len(record.posts) == len(answer.message_ids) == 2
        assert all(p["response_type"] == "ephemeral" for p in record.posts)
        assert "".join(record.ephemeral_texts).count("line ") == 60
        await ch.send(notice("C0GENERAL", "the next notice", answers=msg.message_id))  # answered
        assert [c["payload"]["text"] for c in posted(fake)][-1] == "the next notice"
    finally:
        await ch.stop()


async def test_refused_or_expired_url_falls_back_to_the_conversation(slack):  # tests/conftest.py
    fake = slack
    clock, inbox = FakeClock(), []
    ch = await started_slack(fake, clock, collect(inbox))
    try:
        fake.responses.ttl = 0.0  # Slack says expired_url
        await fake.push_command("/help")
        await until(lambda: inbox)
        result = await ch.send(notice("U0ALICE", "help text", answers=inbox[-1].message_id))
        assert result.ok and posted(fake)[-1]["payload"]["text"] == "help text"

        fake.responses.ttl = 1800.0
        env = await fake.push_command("/status")
        await until(lambda: len(inbox) == 2)
        await clock.advance(URL_TTL + 1)  # unanswered past the URL's life: forgotten
        await ch.send(notice("U0ALICE", "late status", answers=inbox[-1].message_id))
        assert posted(fake)[-1]["payload"]["text"] == "late status"
        assert fake.responses.of(env["payload"]["response_url"]).posts == []
    finally:
        await ch.stop()


async def test_foreign_response_url_is_never_called(slack):  # tests/conftest.py
    fake = slack
    clock, inbox = FakeClock(), []
    ch = await started_slack(fake, clock, collect(inbox))
    try:
        with capture_logs() as logs:
            body = {"command": "/help", "text": "", "user_id": "U0ALICE",
                    "channel_id": "D0ALICE", "trigger_id": "t1",
                    "response_url": "http://169.254.169.254/latest/meta-data"}
            await ch.dispatch("command", body, clock.time())
            await until(lambda: inbox)
        assert any(e["event"] == "slack_response_url_refused" for e in logs)
        await ch.send(notice("U0ALICE", "help text", answers=inbox[-1].message_id))
        assert posted(fake)[-1]["payload"]["text"] == "help text"
    finally:
        await ch.stop()


async def test_refused_sender_is_told_at_once(tmp_path, model, slack):
    from tests.helpers import base_config, running_gateway
    section = {"enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
               "api_base_url": slack.api_url, "dm_policy": "allowlist",
               "allow_from": ["U0BOB"]}
    async with running_gateway(base_config(tmp_path / "s", model.base_url,
                                           channels={"slack": section})):
        env = await slack.push_command("/status")  # from alice, not allowlisted
        record = slack.responses.of(env["payload"]["response_url"])
        await until(lambda: record.posts)
        assert record.ephemeral_texts == ["This command is not available here."]
        assert posted(slack) == []


async def test_every_command_answers_at_its_response_url(tmp_path, model, slack):
    from channels.inbound.commands import CATALOGUE
    from tests.helpers import base_config, running_gateway
    section = {"enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
               "api_base_url": slack.api_url, "dm_policy": "open",
               "group_policy": "allowlist", "groups": ["C0GENERAL"]}
    async with running_gateway(base_config(tmp_path / "s", model.base_url,
                                           channels={"slack": section})):
        for spec in CATALOGUE:
            where = "C0GENERAL" if spec.scope == "group" else None
            env = await slack.push_command(f"/{spec.name}", channel=where)
            record = slack.responses.of(env["payload"]["response_url"])
            await until(lambda record=record: record.posts)
            [text] = record.ephemeral_texts
            assert text and "not available" not in text, (spec.name, text)
        assert posted(slack) == []
