"""Telegram through the whole gateway (issue 3 "How it is proven"): the real gateway
in-process, the real TelegramChannel (python-telegram-bot) against the fake Bot API, and
the fake OpenAI model. Each test asserts what the fake platform received, what the model
was asked, and what ended up on disk.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from gateway.channels.boot import pairing_routes
from tests.channel_harness import (
    BOT_REPLY,
    EventHook,
    chat_requests,
    code_line_numbers,
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
from tests.fakes.fake_telegram import FakeTelegram, parse_html, utf16_len
from tests.helpers import base_config, running_gateway

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning"),
]

USER, OTHER = 4242, 999
GROUP = -1001234567890
BOT = "@tidegate_test_bot"
DM_KEY = f"agent:main:telegram:dm:{USER}"
GROUP_KEY = f"agent:main:telegram:group:{GROUP}"


def config(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, **access: Any) -> dict:
    section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
               "poll_timeout": 1, "dm_policy": "open", "group_policy": "allowlist",
               "groups": [str(GROUP)], 
               # the non-streamed path (tests/test_streaming.py covers streaming)
               "streaming": "off", **access}
    return base_config(tmp_path / "state", model.base_url, channels={"telegram": section},
                       messages={"typing_interval": "0.15s"})


def replies(tg: FakeTelegram, chat: int) -> list[dict[str, Any]]:
    return tg.bot_messages(chat)


def texts(tg: FakeTelegram, chat: int) -> list[str]:
    return [m["text"] for m in tg.bot_messages(chat)]


def sends(tg: FakeTelegram, method: str = "sendMessage") -> list[dict[str, Any]]:
    return [s for s in tg.sent if s["method"].lower() == method.lower()]


async def test_dm_reply_typing_and_command_menu(tmp_path, model, tg):
    model.script_text(BOT_REPLY, delay=0.5)
    async with running_gateway(config(tmp_path, model, tg)) as gw:
        # setMyCommands at start: the chat commands in Telegram's menu
        assert [c["command"] for c in tg.commands or []] == [
            "new", "reset", "end", "stop", "status", "model", "think", "compact", "fork",
            "rewind", "usage", "verbose", "subagents", "forget", "help"]
        assert "activation" in [c["command"] for c in tg.commands_by_scope["all_group_chats"]]
        update = tg.inject_message("hello bot", chat_id=USER, user_id=USER)
        [reply] = await until(lambda: replies(tg, USER), what="the DM reply")
        typing_at_reply = len(sends(tg, "sendChatAction"))
        # the reply: same chat, Telegram HTML, quoting the user's message
        assert reply["text"] == "Hi there, <b>friend</b>!" and reply["parse_mode"] == "HTML"
        assert reply["reply_parameters"]["message_id"] == update["message"]["message_id"]
        [req] = chat_requests(model)
        assert last_user_text(req).endswith("hello bot")
        # typing while the turn ran (0.5 s model call, refreshed every 0.15 s), then stopped
        typing = sends(tg, "sendChatAction")
        assert typing_at_reply >= 2
        assert all(t["payload"] == {"chat_id": USER, "action": "typing"} for t in typing)
        first_send = next(i for i, s in enumerate(tg.sent) if s["method"] == "sendMessage")
        assert tg.sent[0]["method"] == "getMe" and any(
            s["method"] == "sendChatAction" for s in tg.sent[:first_send])
        await until(lambda: not any(gw.lanes.stats()["running"].values()),
                    what="the lane to go idle")
        settled = len(sends(tg, "sendChatAction"))
        await asyncio.sleep(0.45)
        assert len(sends(tg, "sendChatAction")) == settled, "typing went on after the turn"
        await sessions_with(gw.state_dir, DM_KEY)


async def test_group_mention_gating_and_three_sessions(tmp_path, model, tg):
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, tg)) as gw:
            tg.inject_message("just chatting, not for the bot", chat_id=GROUP, user_id=USER)
            tg.inject_message(f"{BOT} what's the tide today?", chat_id=GROUP, user_id=USER)
            [answer] = await until(lambda: replies(tg, GROUP), what="the group reply")
            assert "message_thread_id" not in answer
            # only the mention ran; the other message was logged with its reason
            assert [last_user_text(r) for r in chat_requests(model)][-1].endswith(
                "what's the tide today?")
            assert len(chat_requests(model)) == 1
            [denied] = log_events(logs, "inbound_denied", reason="mention_required")
            assert denied["chat_type"] == "group" and denied["group_id"] == str(GROUP)

            # replying to the bot's message counts as a mention
            last_bot = max(mid for (chat, mid) in tg.messages if chat == GROUP)
            tg.inject_message("and tomorrow?", chat_id=GROUP, user_id=USER,
                              reply_to_message_id=last_bot)
            await until(lambda: len(replies(tg, GROUP)) == 2, what="reply-to-bot answer")

            # a forum topic is its own session, answered inside the topic
            tg.inject_message(f"{BOT} topic question", chat_id=GROUP, user_id=USER,
                              thread_id=77)
            await until(lambda: len(replies(tg, GROUP)) == 3, what="the topic reply")
            assert replies(tg, GROUP)[-1]["message_thread_id"] == 77

            tg.inject_message("and a DM", chat_id=USER, user_id=USER)
            await until(lambda: replies(tg, USER), what="the DM reply")
            assert len(chat_requests(model)) == 4
            keys = (DM_KEY, GROUP_KEY, f"{GROUP_KEY}:thread:77")
            on_disk = await sessions_with(gw.state_dir, *keys)
            ids = {on_disk[k]["session_id"] for k in keys}
            assert len(ids) == 3


async def test_redelivered_update_never_runs_twice(tmp_path, model, tg):
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, tg)):
            update = tg.inject_message("only once please", chat_id=USER, user_id=USER)
            await until(lambda: replies(tg, USER), what="first reply")
            tg.redeliver(update)  # byte for byte, as after an unconfirmed offset
            tg.inject_message("sentinel", chat_id=USER, user_id=USER)
            await until(lambda: len(replies(tg, USER)) == 2, what="sentinel reply")
    texts = [last_user_text(r) for r in chat_requests(model)]
    assert len(texts) == 2 and texts[0].endswith("only once please")
    assert texts[1].endswith("sentinel")
    assert log_events(logs, "inbound_duplicate", channel="telegram")


async def test_long_reply_is_split_under_4096_with_balanced_code_blocks(tmp_path, model, tg):
    text = long_reply()
    model.script_text(text)
    async with running_gateway(config(tmp_path, model, tg)):
        update = tg.inject_message("send me the script", chat_id=USER, user_id=USER)
        await until(lambda: "That's all." in "".join(
            m["text"] for m in replies(tg, USER)), what="every part")
    parts = replies(tg, USER)
    assert len(parts) >= 3
    rendered = []
    for p in parts:
        assert p["parse_mode"] == "HTML"
        assert utf16_len(p["text"]) <= 4096  # even the HTML source fits
        assert p["text"].count("<pre>") == p["text"].count("</pre>")
        rendered.append(parse_html(p["text"]))  # well-formed in every part
    assert code_line_numbers(rendered) == list(range(110))  # nothing lost or repeated
    assert parts[0]["reply_parameters"]["message_id"] == update["message"]["message_id"]
    assert all("reply_parameters" not in p for p in parts[1:])
    assert all(s["status"] == 200 for s in sends(tg))


async def test_markup_rejection_falls_back_to_plain_text(tmp_path, model, tg):
    model.script_text(BOT_REPLY)
    tg.reject_markup(count=1)
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, tg)):
            tg.inject_message("format this", chat_id=USER, user_id=USER)
            [reply] = await until(lambda: replies(tg, USER), what="the plain reply")
    first, second = sends(tg)
    assert first["status"] == 400 and first["payload"]["parse_mode"] == "HTML"
    assert second["status"] == 200 and "parse_mode" not in second["payload"]
    assert reply["text"] == "Hi there, friend!"
    assert log_events(logs, "markup_rejected")


async def test_after_a_refused_markup_every_later_part_is_plain_text(tmp_path, model, tg):
    """The refused HTML used to be tried again for the next part (HTML, plain, HTML...)."""
    model.script_text(long_reply())
    tg.reject_markup(count=1)
    async with running_gateway(config(tmp_path, model, tg)):
        tg.inject_message("send me the script", chat_id=USER, user_id=USER)
        await until(lambda: "That's all." in "".join(
            m["text"] for m in replies(tg, USER)), what="every part")
    attempts = sends(tg)
    assert attempts[0]["status"] == 400 and attempts[0]["payload"]["parse_mode"] == "HTML"
    assert len(attempts) >= 4 and all(a["status"] == 200 for a in attempts[1:])
    assert all("parse_mode" not in a["payload"] for a in attempts[1:])
    assert all("<pre>" not in a["payload"]["text"] for a in attempts[1:])


async def test_rate_limit_retry_after_is_honoured(tmp_path, model, tg):
    tg.rate_limit(count=1, retry_after=1)
    async with running_gateway(config(tmp_path, model, tg)):
        tg.inject_message("are you there?", chat_id=USER, user_id=USER)
        await until(lambda: replies(tg, USER), what="the reply after the 429")
    limited, ok = sends(tg)
    assert limited["status"] == 429 and ok["status"] == 200
    assert ok["time"] - limited["time"] >= 0.95  # waited retry_after (1 s)
    assert ok["payload"]["text"] == "echo: are you there?"


async def test_outage_reply_kept_in_outbox_then_delivered(tmp_path, model, tg):
    model.script_text("the answer survived the outage", delay=0.3)
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, tg)) as gw:
            tg.inject_message("question during an outage", chat_id=USER, user_id=USER)
            await until(lambda: chat_requests(model), what="the model call")
            await tg.outage("5xx")
            [entry] = await until(lambda: outbox_files(gw.state_dir), what="outbox entry")
            assert entry["message"]["channel"] == "telegram"
            assert entry["message"]["to"] == str(USER)
            assert entry["message"]["text"] == "the answer survived the outage"
            await until(lambda: gw.status()["channels"]["telegram"]["state"] == "reconnecting",
                        what="telegram to notice the outage")
            assert gw.status()["outbox"]["pending"] == 1
            assert not replies(tg, USER)
            [entry] = outbox_files(gw.state_dir)  # its own next retry would be then
            await tg.recover()
            [reply] = await until(lambda: replies(tg, USER), what="delivery after recovery")
            # sent because the channel reconnected, not because the backoff ran out
            assert time.time() < entry["next_attempt_at"]
            assert reply["text"] == "the answer survived the outage"
            await until(lambda: not outbox_files(gw.state_dir), what="outbox to drain")
            assert gw.status()["outbox"]["pending"] == 0
    assert log_events(logs, "outbox_woken", channel="telegram")
    assert log_events(logs, "outbox_sent", channel="telegram")
    assert len(chat_requests(model)) == 1


async def test_pairing_flow_with_the_cli(tmp_path, model, tg):
    cfg = config(tmp_path, model, tg, dm_policy="pairing")
    path = write_config(tmp_path, cfg)
    async with running_gateway(cfg):
        tg.inject_message("hi, who are you?", chat_id=USER, user_id=USER, first_name="Ann")
        [notice] = await until(lambda: replies(tg, USER), what="the pairing code")
        code = notice["text"].split("pairing code is ")[1].split(".")[0]
        assert f"tidegate pairing approve telegram {code}" in notice["text"]
        assert chat_requests(model) == []  # nothing ran

        rc, out, _ = await run_cli(path, "pairing", "list", "--json")
        [pending] = json.loads(out)
        assert rc == 0 and pending["code"] == code and pending["sender_id"] == str(USER)
        assert pending["channel"] == "telegram" and pending["sender_name"] == "Ann"
        rc, out, _ = await run_cli(path, "pairing", "list")
        assert rc == 0 and code in out and str(USER) in out

        rc, _, err = await run_cli(path, "pairing", "approve", "telegram", "WRONGCDE")
        assert rc == 1 and "no pending pairing request" in err
        rc, out, _ = await run_cli(path, "pairing", "approve", "telegram", code.lower())
        assert rc == 0 and f"approved telegram sender {USER} (Ann)" in out

        # the running gateway sees the approval at once
        tg.inject_message("now may I ask?", chat_id=USER, user_id=USER)
        await until(lambda: "echo: now may I ask?" in texts(tg, USER), what="the answer")
        rc, out, _ = await run_cli(path, "pairing", "list", "--approved", "--json")
        assert [a["sender_id"] for a in json.loads(out)] == [str(USER)]
        rc, out, _ = await run_cli(path, "pairing", "list", "--json")
        assert json.loads(out) == []

        rc, out, _ = await run_cli(path, "pairing", "revoke", "telegram", str(USER))
        assert rc == 0 and "revoked" in out
        before = len(texts(tg, USER))
        tg.inject_message("still there?", chat_id=USER, user_id=USER)
        await until(lambda: len(texts(tg, USER)) > before, what="a fresh pairing code")
        assert "pairing code is" in texts(tg, USER)[-1]
        assert len(chat_requests(model)) == 1
    rc, _, err = await run_cli(path, "pairing", "approve", "bad/name", "X")
    assert rc == 2 and "invalid channel name" in err


async def test_approval_greeting_route(tmp_path, model, tg):
    """The control route ``tidegate pairing approve`` calls to greet the sender."""
    async with running_gateway(config(tmp_path, model, tg, dm_policy="pairing")) as gw:
        app = web.Application()
        app.add_routes(pairing_routes(gw))
        async with TestServer(app) as server, aiohttp.ClientSession() as http:
            url = server.make_url("/api/pairing/approved")
            auth = {"Authorization": f"Bearer {gw.token}"}
            body = {"channel": "telegram", "sender_id": str(USER)}
            async with http.post(url, json=body) as r:
                assert r.status == 401
            async with http.post(url, json=body, headers=auth) as r:
                assert r.status == 409  # not approved: no message to arbitrary ids
            async with http.post(url, json={"channel": "telegram"}, headers=auth) as r:
                assert r.status == 400
            req = gw.pairing.request("telegram", "default", str(USER), "Ann")
            gw.pairing.approve("telegram", req.code)
            async with http.post(url, json=body, headers=auth) as r:
                assert r.status == 200 and (await r.json())["ok"] is True
        [greeting] = replies(tg, USER)
        assert greeting["text"].startswith("You're approved")
    assert chat_requests(model) == []


async def test_denied_sender_is_logged_and_never_reaches_the_model(tmp_path, model, tg):
    cfg = config(tmp_path, model, tg, dm_policy="allowlist", allow_from=[str(OTHER)])
    with capture_logs() as logs:
        async with running_gateway(cfg):
            tg.inject_message("let me in", chat_id=USER, user_id=USER)
            tg.inject_message("I am allowed", chat_id=OTHER, user_id=OTHER)
            await until(lambda: replies(tg, OTHER), what="the allowed sender's reply")
    assert [last_user_text(r)[-12:] for r in chat_requests(model)] == ["I am allowed"]
    assert replies(tg, USER) == []
    [denied] = log_events(logs, "inbound_denied", sender_id=str(USER))
    assert denied["reason"] == "not_in_allowlist" and denied["channel"] == "telegram"


async def test_new_status_help_commands(tmp_path, model, tg):
    async with running_gateway(config(tmp_path, model, tg)) as gw:
        tg.inject_message("remember me", chat_id=USER, user_id=USER)
        await until(lambda: replies(tg, USER), what="first reply")
        first_id = (await sessions_with(gw.state_dir, DM_KEY))[DM_KEY]["session_id"]
        tg.inject_message("/help", chat_id=USER, user_id=USER)
        await until(lambda: len(replies(tg, USER)) == 2)
        assert "/new" in replies(tg, USER)[-1]["text"]
        tg.inject_message("/status", chat_id=USER, user_id=USER)
        await until(lambda: len(replies(tg, USER)) == 3)
        status = replies(tg, USER)[-1]["text"]
        assert f"Session: {DM_KEY}" in status and first_id in status
        assert "telegram=connected" in status
        tg.inject_message(f"/new{BOT}", chat_id=USER, user_id=USER)
        await until(lambda: len(replies(tg, USER)) == 4)
        assert replies(tg, USER)[-1]["text"] == "Started a new session."
        await new_session_on_disk(gw.state_dir, DM_KEY, first_id)
        # in a group the command addressed to the bot works too
        tg.inject_message(f"/help{BOT}", chat_id=GROUP, user_id=USER)
        await until(lambda: replies(tg, GROUP), what="group /help")
        assert "/status" in replies(tg, GROUP)[-1]["text"]
    assert len(chat_requests(model)) == 1  # commands never call the model


async def test_reactions_and_edits_become_system_events(tmp_path, model, tg):
    hook = EventHook()
    async with running_gateway(config(tmp_path, model, tg)) as gw:
        wired = gw.intake.on_channel_event

        def record(key: str, text: str, source: str, **kw) -> None:
            hook(key, text, source)
            if wired is not None:
                wired(key, text, source, **kw)
        gw.intake.on_channel_event = record
        tg.inject_message("hello", chat_id=USER, user_id=USER)
        await until(lambda: replies(tg, USER))
        bot_msg = max(mid for (chat, mid) in tg.messages if chat == USER)
        tg.inject_reaction(USER, bot_msg, USER, new=["👍"])
        group_msg = tg.inject_message(f"{BOT} first wording", chat_id=GROUP, user_id=USER)
        await until(lambda: replies(tg, GROUP))
        tg.inject_edit(GROUP, group_msg["message"]["message_id"], f"{BOT} second wording")
        await until(lambda: len(hook.calls) == 2, what="two system events")
    (k1, t1, s1), (k2, t2, s2) = hook.calls
    assert (k1, s1) == (DM_KEY, "telegram.reaction") and "👍" in t1
    assert (k2, s2) == (GROUP_KEY, "telegram.edit") and "second wording" in t2
    assert len(chat_requests(model)) == 2  # events ride along, they never start a turn


async def test_webhook_mode_on_the_gateway_http_server(tmp_path, model, tg):
    secret = "s3cret-Token_1"
    cfg = config(tmp_path, model, tg, mode="webhook", webhook_secret=secret)
    async with running_gateway(cfg) as gw:
        hook = f"http://127.0.0.1:{gw.port}/telegram/webhook"
        async with aiohttp.ClientSession() as http:
            # webhook_url unset: the operator registers the webhook (here: at the fake)
            async with http.post(f"{tg.url}/bot{tg.token}/setWebhook",
                                 json={"url": hook, "secret_token": secret}) as r:
                assert r.status == 200
            forged = {"update_id": 1, "message": {"message_id": 1, "date": 0, "text": "x",
                                                  "chat": {"id": USER, "type": "private"}}}
            async with http.post(hook, json=forged) as r:
                assert r.status == 403  # no secret header
        tg.inject_message("hello over the webhook", chat_id=USER, user_id=USER)
        [reply] = await until(lambda: replies(tg, USER), what="the webhook reply")
    assert reply["text"] == "echo: hello over the webhook"
    assert [d["status"] for d in tg.webhook_deliveries] == [200]
    assert len(chat_requests(model)) == 1


async def test_every_command_is_answered_without_the_model(tmp_path, model, tg):
    """Each command of the catalogue (channels/inbound/commands.py) typed on Telegram gets its own
    answer and never reaches the model (``/activation`` in a group, the rest in the DM)."""
    from channels.inbound.commands import CATALOGUE
    async with running_gateway(config(tmp_path, model, tg, allow_from=[str(USER)])):
        for n, spec in enumerate(CATALOGUE, start=1):
            chat = GROUP if spec.scope == "group" else USER
            before = len(texts(tg, chat))
            tg.inject_message(f"/{spec.name}{BOT if chat == GROUP else ''}", chat_id=chat,
                              user_id=USER)
            await until(lambda c=chat, b=before: len(texts(tg, c)) > b, what=f"/{spec.name}")
            assert texts(tg, chat)[-1].strip(), spec.name
    assert chat_requests(model) == []


@pytest.mark.parametrize("status", [429, 403])
async def test_refused_command_menu_never_costs_the_connection(tmp_path, model, tg, status):
    """setMyCommands refused at start (a 30 s flood wait, a 403): logged, and the bot
    answers at once — the menu is a convenience, typed commands work anyway."""
    tg.fail("setMyCommands", status=status, retry_after=30 if status == 429 else None)
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, tg)):
            tg.inject_message("/help", chat_id=USER, user_id=USER)
            await until(lambda: replies(tg, USER), what="the answer")
    events = [entry["event"] for entry in logs]
    assert "telegram_set_commands_failed" in events
    assert "telegram_connection_lost" not in events
    assert [s["method"] for s in tg.sent].count("getMe") == 1


async def test_a_reply_stuck_in_the_outbox_is_a_problem(tmp_path, model, tg):
    """Telegram refuses every send: the reply waits in the outbox quietly at first; once
    its first retry failed too (or after a minute) ``status`` (``tidegate status --json``
    and the control API the Channels and Problems views render) names it: how many, for
    which account, how old, the last error. Delivered at last, the problem goes away."""
    from runtime.clock import FakeClock
    clock = FakeClock(time.time())
    model.script_text("an answer telegram will not take")
    tg.fail("sendMessage", status=500, count=1000, description="Internal Server Error")
    async with running_gateway(config(tmp_path, model, tg), clock=clock) as gw:
        tg.inject_message("are you there?", chat_id=USER, user_id=USER)
        await until(lambda: outbox_files(gw.state_dir), what="outbox entry")
        assert not [p for p in gw.status()["problems"] if "outbox" in p]  # a blip: quiet
        [group] = gw.status()["outbox"]["waiting"]
        assert (group["channel_key"], group["count"], group["stuck"]) == ("telegram", 1, 0)
        await clock.advance(6)  # the first retry (after 5 s) fails too
        await until(lambda: outbox_files(gw.state_dir)[0]["attempts"] >= 2,
                    what="the retry")
        code, out, err = await run_cli(write_config(tmp_path, config(tmp_path, model, tg)),
                                       "status", "--json")
        assert code == 0, err
        problems = [p for p in json.loads(out)["problems"] if "outbox" in p]
        assert len(problems) == 1, problems
        assert problems == [("1 reply waiting in the outbox for telegram:default (oldest 6s, "
                            "2 attempts, next retry in 29s); last error: NetworkError: "
                            "Internal Server Error")]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{gw.port}/status",
                                headers={"Authorization": f"Bearer {gw.token}"}) as r:
                api = await r.json()
        assert [p for p in api["problems"] if "outbox" in p] == problems
        [group] = api["outbox"]["waiting"]
        assert (group["channel_key"], group["count"], group["stuck"], group["attempts"]) == (
            "telegram", 1, 1, 2)
        tg._failures.clear()  # telegram takes sends again
        await clock.advance(60)
        await until(lambda: replies(tg, USER), what="delivery")
        assert not [p for p in gw.status()["problems"] if "outbox" in p]
        assert gw.status()["outbox"]["waiting"] == []
