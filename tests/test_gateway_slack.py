"""Slack through the whole gateway (issue 3 "How it is proven"): the real gateway
in-process, the real SlackChannel (slack-bolt async + slack-sdk, Socket Mode) against the
fake Slack (Web API + Socket Mode WebSocket), and the fake OpenAI model.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.channel_harness import (
    BOT_REPLY,
    EventHook,
    chat_requests,
    code_line_numbers,
    fences_balanced,
    last_user_text,
    log_events,
    long_reply,
    new_session_on_disk,
    outbox_files,
    run_cli,
    sessions_with,
    until,
    write_config,
)
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_slack import FakeSlack
from tests.helpers import base_config, running_gateway

pytestmark = pytest.mark.timeout(30)

ALICE, BOB = "U0ALICE", "U0BOB"
IM = "D0ALICE"
CHANNEL = "C0GENERAL"
DM_KEY = "agent:main:slack:dm:u0alice"
GROUP_KEY = "agent:main:slack:group:c0general"


def config(tmp_path: Path, model: FakeOpenAI, slack: FakeSlack, **access: Any) -> dict:
    # api_base_url without the trailing slash on purpose: the adapter adds it
    section = {"enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
               "api_base_url": slack.api_url.rstrip("/"), "dm_policy": "open",
               "group_policy": "allowlist", "groups": [CHANNEL], 
               # the non-streamed path (tests/test_streaming.py covers streaming)
               "streaming": "off", **access}
    return base_config(tmp_path / "state", model.base_url, channels={"slack": section},
                       messages={"typing_interval": "0.15s"})


def posts(slack: FakeSlack, channel: str | None = None) -> list[dict[str, Any]]:
    """Accepted chat.postMessage payloads (to the resolved ``channel``)."""
    return slack.messages(channel)


def texts(slack: FakeSlack, channel: str) -> list[str]:
    return [p["text"] for p in posts(slack, channel)]


def attempts(slack: FakeSlack) -> list[dict[str, Any]]:
    return [c for c in slack.calls if c["method"] == "chat.postMessage"]


async def test_dm_reply_in_the_same_conversation(tmp_path, model, slack):
    model.script_text(BOT_REPLY)
    async with running_gateway(config(tmp_path, model, slack)) as gw:
        await slack.push_event(slack.dm("hello bot"))
        [reply] = await until(lambda: posts(slack, IM), what="the DM reply")
        assert reply["text"] == "Hi there, *friend*!"  # mrkdwn
        assert "thread_ts" not in reply
        [req] = chat_requests(model)
        assert last_user_text(req).endswith("hello bot")
        await sessions_with(gw.state_dir, DM_KEY)
        # the fake echoed our post back as a message event: it never ran a turn
        await until(lambda: len(slack.envelopes) >= 2, what="the echo")
        assert gw.status()["channels"]["slack"]["state"] == "connected"
    assert len(chat_requests(model)) == 1


async def test_mentions_threads_and_three_sessions(tmp_path, model, slack):
    # reply_in_thread off: a channel mention is answered in the channel itself
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, slack,
                                          reply_in_thread=False)) as gw:
            await slack.push_event(slack.message("just chatting, not for the bot"))
            # a mention arrives twice (message + app_mention, same ts): one turn
            mention = slack.message(slack.mention_text("what's the tide today?"))
            await slack.push_event(mention)
            await slack.push_event(slack.app_mention(mention["text"], ts=mention["ts"]))
            [answer] = await until(lambda: posts(slack, CHANNEL), what="the channel reply")
            assert "thread_ts" not in answer
            [denied] = log_events(logs, "inbound_denied", reason="mention_required")
            assert denied["group_id"] == CHANNEL

            # in a thread: answered in the thread, typing status shown there
            root = mention["ts"]
            await slack.push_event(slack.message(slack.mention_text("thread question"),
                                                 thread_ts=root))
            await until(lambda: len(posts(slack, CHANNEL)) == 2, what="the thread reply")
            assert posts(slack, CHANNEL)[-1]["thread_ts"] == root
            status = [c for c in slack.calls if c["method"] == "assistant.threads.setStatus"]
            assert status and status[0]["payload"]["thread_ts"] == root

            await slack.push_event(slack.dm("and a DM"))
            await until(lambda: posts(slack, IM), what="the DM reply")
            assert len(chat_requests(model)) == 3
            thread_key = f"{GROUP_KEY}:thread:{root}"
            on_disk = await sessions_with(gw.state_dir, DM_KEY, GROUP_KEY, thread_key)
            assert len({on_disk[k]["session_id"] for k in (DM_KEY, GROUP_KEY,
                                                            thread_key)}) == 3
    assert log_events(logs, "inbound_duplicate", channel="slack")  # the app_mention twin


async def test_redelivered_event_never_runs_twice(tmp_path, model, slack):
    async with running_gateway(config(tmp_path, model, slack)):
        env = await slack.push_event(slack.dm("only once please"))
        await until(lambda: posts(slack, IM), what="first reply")
        await slack.redeliver(env)  # Slack's retry: same event_id, retry_attempt 1
        await slack.push_event(slack.dm("sentinel"))
        await until(lambda: len(posts(slack, IM)) == 2, what="sentinel reply")
    asked = [last_user_text(r) for r in chat_requests(model)]
    assert len(asked) == 2 and asked[1].endswith("sentinel")
    assert [e["retry_attempt"] for e in slack.envelopes
            if e["payload"]["event"].get("text") == "only once please"] == [0, 1]


async def test_event_not_accepted_in_time_is_not_acked_and_its_retry_answered_once(
        tmp_path, model, slack):
    """The rule "a crash loses nothing acknowledged": an event the gateway has not
    journaled within the adapter's wait (here its file is still downloading; the intake
    journals after the download) is not acknowledged, so Slack retries it. The retry waits
    for the same acceptance, is acked once that is done, and the message runs once."""
    slack.redeliver_after = 3.0  # Slack's retry of an event not acked within 3 s
    model.script_text(BOT_REPLY)
    async with running_gateway(config(tmp_path, model, slack)):
        slack.hold_downloads()  # a slow file host
        note = slack.add_file("tides.txt", b"low tide at 12:40", "text/plain")
        acked = lambda: {a["envelope_id"] for a in slack.acks}
        with capture_logs() as logs:
            env = await slack.push_event(slack.dm("read this", subtype="file_share",
                                                  files=[note]))
            eid = env["payload"]["event_id"]
            tries = lambda: [e for e in slack.envelopes
                             if e["payload"].get("event_id") == eid]
            await until(lambda: len(tries()) >= 2 or env["envelope_id"] in acked(),
                        timeout=8, what="Slack's retry (or an ack)")
            assert env["envelope_id"] not in acked(), "acked before it was journaled"
            assert log_events(logs, "slack_ack_withheld", event_id=eid)
            await until(lambda: log_events(logs, "slack_redelivery_joined", event_id=eid),
                        what="the retry waiting for the same acceptance")
            slack.hold_downloads(False)
            [reply] = await until(lambda: posts(slack, IM), what="the reply")
            await until(lambda: acked() & {e["envelope_id"] for e in tries()},
                        what="a retry acked once accepted")
            await slack.push_event(slack.dm("sentinel"))
            await until(lambda: len(posts(slack, IM)) == 2, what="the sentinel reply")
    assert reply["text"] == "Hi there, *friend*!"
    [withheld, *_] = log_events(logs, "slack_ack_withheld", event_id=eid)
    assert withheld["waited_s"] >= 2.5 and withheld["log_level"] == "warning"
    assert env["envelope_id"] not in acked()
    asked = [last_user_text(r) for r in chat_requests(model)]
    assert len(asked) == 2 and "read this" in asked[0] and asked[1].endswith("sentinel")
    attempts = [e["retry_attempt"] for e in tries()]
    assert attempts == list(range(len(attempts))) and 2 <= len(attempts) <= 4


async def test_long_reply_is_split_under_4000_with_balanced_fences(tmp_path, model, slack):
    model.script_text(long_reply())
    async with running_gateway(config(tmp_path, model, slack)):
        root = slack.next_ts()
        await slack.push_event(slack.message(slack.mention_text("the script please"),
                                             ts=root))
        await until(lambda: "That's all." in "".join(texts(slack, CHANNEL)), what="all parts")
    parts = posts(slack, CHANNEL)
    assert len(parts) >= 3
    for p in parts:
        assert len(p["text"]) <= 4000
        assert fences_balanced(p["text"])
    assert code_line_numbers([p["text"] for p in parts]) == list(range(110))


async def test_markup_rejection_falls_back_to_plain_text(tmp_path, model, slack):
    model.script_text("Use <b> & **bold**")
    slack.fail_next("chat.postMessage", kind="markup")
    async with running_gateway(config(tmp_path, model, slack)):
        await slack.push_event(slack.dm("format this"))
        [reply] = await until(lambda: posts(slack, IM), what="the plain reply")
    first, second = attempts(slack)
    assert first["error"] == "invalid_blocks" and first["payload"]["mrkdwn"] is True
    assert second["payload"]["mrkdwn"] is False
    assert reply["text"] == "Use &lt;b&gt; &amp; bold"  # plain, escaped as Slack requires


async def test_rate_limit_retry_after_is_honoured(tmp_path, model, slack):
    slack.fail_next("chat.postMessage", kind="ratelimited", retry_after=1)
    async with running_gateway(config(tmp_path, model, slack)):
        await slack.push_event(slack.dm("are you there?"))
        await until(lambda: posts(slack, IM), what="the reply after the 429")
    limited, ok = attempts(slack)
    assert limited["status"] == 429 and ok["status"] == 200
    assert ok["at"] - limited["at"] >= 0.95
    assert ok["payload"]["text"] == "echo: are you there?"


async def test_outage_reply_kept_in_outbox_then_delivered(tmp_path, model, slack):
    model.script_text("the answer survived the outage", delay=0.3)
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, slack)) as gw:
            await slack.push_event(slack.dm("question during an outage"))
            await until(lambda: chat_requests(model), what="the model call")
            await slack.set_outage(True, "5xx")
            [entry] = await until(lambda: outbox_files(gw.state_dir), what="outbox entry")
            assert entry["message"]["channel"] == "slack" and entry["message"]["to"] == ALICE
            await until(lambda: gw.status()["channels"]["slack"]["state"] == "reconnecting",
                        what="slack to notice the outage")
            assert not posts(slack, IM)
            [entry] = outbox_files(gw.state_dir)  # its own next retry would be then
            await slack.set_outage(False)
            [reply] = await until(lambda: posts(slack, IM), what="delivery after recovery")
            # sent because the channel reconnected, not because the backoff ran out
            assert time.time() < entry["next_attempt_at"]
            assert reply["text"] == "the answer survived the outage"
            await until(lambda: not outbox_files(gw.state_dir), what="outbox to drain")
    assert log_events(logs, "outbox_woken", channel="slack")
    assert len(chat_requests(model)) == 1


async def test_pairing_flow_with_the_cli(tmp_path, model, slack):
    cfg = config(tmp_path, model, slack, dm_policy="pairing")
    path = write_config(tmp_path, cfg)
    async with running_gateway(cfg):
        await slack.push_event(slack.dm("hi, who are you?", user=BOB))
        [notice] = await until(lambda: texts(slack, "D0BOB"), what="the pairing code")
        code = notice.split("pairing code is ")[1].split(".")[0]
        assert chat_requests(model) == []
        rc, out, _ = await run_cli(path, "pairing", "list", "--channel", "slack", "--json")
        [pending] = json.loads(out)
        assert (pending["code"], pending["sender_id"]) == (code, BOB)
        rc, out, _ = await run_cli(path, "pairing", "approve", "slack", code)
        assert rc == 0 and f"approved slack sender {BOB}" in out
        await slack.push_event(slack.dm("may I ask now?", user=BOB))
        await until(lambda: "echo: may I ask now?" in texts(slack, "D0BOB"), what="answer")
    assert len(chat_requests(model)) == 1


async def test_denied_sender_is_logged_and_never_reaches_the_model(tmp_path, model, slack):
    cfg = config(tmp_path, model, slack, dm_policy="allowlist", allow_from=[BOB])
    with capture_logs() as logs:
        async with running_gateway(cfg):
            await slack.push_event(slack.dm("let me in"))
            await slack.push_event(slack.dm("I am allowed", user=BOB))
            await until(lambda: posts(slack, "D0BOB"), what="the allowed sender's reply")
    assert [last_user_text(r)[-12:] for r in chat_requests(model)] == ["I am allowed"]
    assert posts(slack, IM) == []
    [denied] = log_events(logs, "inbound_denied", sender_id=ALICE)
    assert denied["reason"] == "not_in_allowlist" and denied["channel"] == "slack"


async def test_new_status_help_commands(tmp_path, model, slack):
    async with running_gateway(config(tmp_path, model, slack)) as gw:
        await slack.push_event(slack.dm("remember me"))
        await until(lambda: posts(slack, IM), what="first reply")
        first_id = (await sessions_with(gw.state_dir, DM_KEY))[DM_KEY]["session_id"]
        env = await slack.push_command("/help")  # a slash command declared in the manifest
        help_ = slack.responses.of(env["payload"]["response_url"])
        await until(lambda: help_.posts, what="/help answered at its response_url")
        assert "/new" in help_.ephemeral_texts[0]  # ephemeral: only alice sees it
        assert len(posts(slack, IM)) == 1  # nothing posted into the conversation
        await slack.push_event(slack.dm("/status"))  # typed as text: answered in the DM
        await until(lambda: len(posts(slack, IM)) == 2, what="/status")
        assert f"Session: {DM_KEY}" in texts(slack, IM)[-1] and first_id in texts(slack, IM)[-1]
        env = await slack.push_command("/new")  # a lane command, answered after its turn
        new = slack.responses.of(env["payload"]["response_url"])
        await until(lambda: new.posts, what="/new")
        assert new.ephemeral_texts == ["Started a new session."]
        await new_session_on_disk(gw.state_dir, DM_KEY, first_id)
        env = await slack.push_command("/model", "list", channel=CHANNEL)  # in a channel
        listing = slack.responses.of(env["payload"]["response_url"])
        await until(lambda: listing.posts, what="/model list")
        assert "fake/fake-model" in listing.ephemeral_texts[0] and not posts(slack, CHANNEL)
        await slack.push_event(slack.message(slack.mention_text("/help")))
        await until(lambda: posts(slack, CHANNEL), what="/help in a channel")
        assert "/status" in texts(slack, CHANNEL)[-1]
    assert len(chat_requests(model)) == 1


async def test_reactions_edits_deletions_become_system_events(tmp_path, model, slack):
    hook = EventHook()
    async with running_gateway(config(tmp_path, model, slack)) as gw:
        wired = gw.intake.on_channel_event

        def record(key: str, text: str, source: str, **kw) -> None:
            hook(key, text, source)
            if wired is not None:
                wired(key, text, source, **kw)
        gw.intake.on_channel_event = record
        asked = slack.dm("hello")
        await slack.push_event(asked)
        await until(lambda: posts(slack, IM))
        bot_ts = slack.sent[-1]["ts"]
        await slack.push_event(slack.reaction("tada", item_ts=bot_ts, channel=IM))
        await slack.push_event(slack.edit(channel=IM, ts=asked["ts"], text="hello there",
                                          old_text="hello"))
        await slack.push_event(slack.reaction("eyes", item_ts=slack.next_ts()))
        await slack.push_event(slack.delete(channel=CHANNEL, ts=slack.next_ts()))
        await until(lambda: len(hook.calls) == 4, what="four system events")
    by_source = {(s, k) for k, _, s in hook.calls}
    assert by_source == {("slack.reaction", DM_KEY), ("slack.edit", DM_KEY),
                         ("slack.reaction", GROUP_KEY), ("slack.delete", GROUP_KEY)}
    assert any(":tada:" in t for _, t, _ in hook.calls)
    assert len(chat_requests(model)) == 1  # none of them started a turn


async def test_http_events_api_on_the_gateway_http_server(tmp_path, model, slack):
    cfg = config(tmp_path, model, slack, mode="http", signing_secret=slack.signing_secret)
    async with running_gateway(cfg) as gw:
        slack.http_target = f"http://127.0.0.1:{gw.port}/slack/events"
        env = await slack.push_event(slack.dm("hello over http"))
        [reply] = await until(lambda: posts(slack, IM), what="the reply")
        assert reply["text"] == "echo: hello over http"
        await slack.redeliver(env, reason="http_timeout")  # X-Slack-Retry-Num: 1
        forged = json.dumps(env["payload"]).encode()
        assert await slack.post_signed(forged, secret="not-the-secret") == 401
        await slack.push_event(slack.dm("sentinel"))
        await until(lambda: len(posts(slack, IM)) == 2, what="the sentinel reply")
        env = await slack.push_command("/status")  # a slash command over HTTP
        status = slack.responses.of(env["payload"]["response_url"])
        await until(lambda: status.posts, what="/status at its response_url")
        assert f"Session: {DM_KEY}" in status.ephemeral_texts[0]
        assert await slack.post_signed(b"command=%2Fstop&user_id=U0ALICE&channel_id=D0ALICE",
                                       content_type="application/x-www-form-urlencoded",
                                       secret="not-the-secret") == 401
    assert len(chat_requests(model)) == 2  # the retry and the forgeries ran nothing
    assert slack.http_responses.count(401) == 2
    assert len(posts(slack, IM)) == 2
