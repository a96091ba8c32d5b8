"""Discord through the whole gateway (issue 3 "How it is proven"): the real gateway
in-process, the real DiscordChannel (discord.py) against the fake Discord (REST + gateway
WebSocket), and the fake OpenAI model.
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
from tests.fakes.fake_discord import FakeDiscord
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway

pytestmark = pytest.mark.timeout(30)


def config(tmp_path: Path, model: FakeOpenAI, dc: FakeDiscord, **access: Any) -> dict:
    section = {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
               "gateway_url": dc.gateway_url, "dm_policy": "open",
               "group_policy": "allowlist", "groups": [dc.channel_id], 
               # the non-streamed path (tests/test_streaming.py covers streaming)
               "streaming": "off", **access}
    return base_config(tmp_path / "state", model.base_url, channels={"discord": section},
                       messages={"typing_interval": "0.15s"})


def dm_key(user_id: str) -> str:
    return f"agent:main:discord:dm:{user_id}"


def group_key(dc: FakeDiscord) -> str:
    return f"agent:main:discord:group:{dc.channel_id}"


def posts(dc: FakeDiscord, channel_id: str) -> list[dict[str, Any]]:
    """Payloads of the accepted ``POST /channels/{channel_id}/messages``."""
    return [s["payload"] for s in dc.sent_messages(channel_id)]


def texts(dc: FakeDiscord, channel_id: str) -> list[str]:
    return [p["content"] for p in posts(dc, channel_id)]


def attempts(dc: FakeDiscord) -> list[dict[str, Any]]:
    return [s for s in dc.sent if s["method"] == "POST" and s["path"].endswith("/messages")]


async def test_dm_reply_with_typing(tmp_path, model, dc):
    model.script_text(BOT_REPLY, delay=0.5)
    async with running_gateway(config(tmp_path, model, dc)) as gw:
        sent = await dc.send_dm("hello bot")
        dm = dc.dm_channels[dc.alice.id]
        [reply] = await until(lambda: posts(dc, dm), what="the DM reply")
        assert reply["content"] == BOT_REPLY  # Discord speaks markdown
        assert str(reply["message_reference"]["message_id"]) == sent["id"]
        typing = [s for s in dc.sent if s["path"] == f"/channels/{dm}/typing"]
        assert len(typing) >= 2  # refreshed while the 0.5 s model call ran
        first_post = next(i for i, s in enumerate(dc.sent) if s["path"].endswith("/messages"))
        assert any(s["path"].endswith("/typing") for s in dc.sent[:first_post])
        [req] = chat_requests(model)
        assert last_user_text(req).endswith("hello bot")
        await sessions_with(gw.state_dir, dm_key(dc.alice.id))
        assert gw.status()["channels"]["discord"]["state"] == "connected"
    assert len(chat_requests(model)) == 1  # the echo of our own post never ran a turn


async def test_mentions_threads_and_three_sessions(tmp_path, model, dc):
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, dc)) as gw:
            await dc.send_guild("just chatting, not for the bot")
            await dc.send_guild("what's the tide today?", mention=True)
            [answer] = await until(lambda: posts(dc, dc.channel_id), what="channel reply")
            assert answer["content"].endswith("what's the tide today?")
            [denied] = log_events(logs, "inbound_denied", reason="mention_required")
            assert denied["group_id"] == dc.channel_id
            await dc.send_guild("and a reply to the bot", reply_to_bot=True)
            await until(lambda: len(posts(dc, dc.channel_id)) == 2, what="reply-to-bot")

            await dc.send_guild("thread question", channel_id=dc.thread_id, mention=True)
            [in_thread] = await until(lambda: posts(dc, dc.thread_id), what="thread reply")
            assert in_thread["content"].endswith("thread question")

            await dc.send_dm("and a DM")
            await until(lambda: posts(dc, dc.dm_channels[dc.alice.id]), what="DM reply")
            assert len(chat_requests(model)) == 4
            keys = (dm_key(dc.alice.id), group_key(dc),
                    f"{group_key(dc)}:thread:{dc.thread_id}")
            on_disk = await sessions_with(gw.state_dir, *keys)
            assert len({on_disk[k]["session_id"] for k in keys}) == 3


async def test_redelivered_event_never_runs_twice(tmp_path, model, dc):
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, dc)):
            first = await dc.send_dm("only once please")
            dm = dc.dm_channels[dc.alice.id]
            await until(lambda: posts(dc, dm), what="first reply")
            await dc.dispatch("MESSAGE_CREATE", first)  # as replayed after a RESUME
            await dc.send_dm("sentinel")
            await until(lambda: len(posts(dc, dm)) == 2, what="sentinel reply")
    asked = [last_user_text(r) for r in chat_requests(model)]
    assert len(asked) == 2 and asked[1].endswith("sentinel")
    assert log_events(logs, "inbound_duplicate", channel="discord")


async def test_long_reply_is_split_under_2000_with_balanced_fences(tmp_path, model, dc):
    model.script_text(long_reply())
    async with running_gateway(config(tmp_path, model, dc)):
        await dc.send_guild("the script please", mention=True)
        await until(lambda: "That's all." in "".join(texts(dc, dc.channel_id)),
                    what="every part")
    parts = texts(dc, dc.channel_id)
    assert len(parts) >= 5
    for p in parts:
        assert len(p) <= 2000 and len(p.encode("utf-16-le")) // 2 <= 2000
        assert fences_balanced(p)
    assert code_line_numbers(parts) == list(range(110))
    refs = [p.get("message_reference") for p in posts(dc, dc.channel_id)]
    assert refs[0] is not None and not any(refs[1:])  # only the first part quotes


async def test_markup_rejection_falls_back_to_plain_text(tmp_path, model, dc):
    model.script_text(BOT_REPLY)
    dc.fail_next_sends(1, "markup")
    async with running_gateway(config(tmp_path, model, dc)):
        await dc.send_dm("format this")
        dm = dc.dm_channels[dc.alice.id]
        [reply] = await until(lambda: posts(dc, dm), what="the plain reply")
    first, second = attempts(dc)
    assert first["status"] == 400 and first["payload"]["content"] == BOT_REPLY
    assert second["status"] == 200
    assert reply["content"] == "Hi there, friend!"


async def test_rate_limit_retry_after_is_honoured(tmp_path, model, dc):
    dc.fail_next_sends(1, "429", retry_after=0.6)
    async with running_gateway(config(tmp_path, model, dc)):
        await dc.send_dm("are you there?")
        dm = dc.dm_channels[dc.alice.id]
        await until(lambda: posts(dc, dm), what="the reply after the 429")
    limited, ok = attempts(dc)
    assert limited["status"] == 429 and ok["status"] == 200
    assert ok["at"] - limited["at"] >= 0.55
    assert ok["payload"]["content"] == "echo: are you there?"


async def test_outage_reply_kept_in_outbox_then_delivered(tmp_path, model, dc):
    model.script_text("the answer survived the outage", delay=0.3)
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, dc)) as gw:
            await dc.send_dm("question during an outage")
            dm = dc.dm_channels[dc.alice.id]
            await until(lambda: chat_requests(model), what="the model call")
            await dc.set_outage(True, "503")
            [entry] = await until(lambda: outbox_files(gw.state_dir), what="outbox entry")
            assert entry["message"]["channel"] == "discord"
            assert entry["message"]["to"] == dc.alice.id
            await until(lambda: gw.status()["channels"]["discord"]["state"] == "reconnecting",
                        what="discord to notice the outage")
            assert not posts(dc, dm)
            [entry] = outbox_files(gw.state_dir)  # its own next retry would be then
            await dc.set_outage(False)
            [reply] = await until(lambda: posts(dc, dm), what="delivery after recovery")
            # sent because the channel reconnected, not because the backoff ran out
            assert time.time() < entry["next_attempt_at"]
            assert reply["content"] == "the answer survived the outage"
            await until(lambda: not outbox_files(gw.state_dir), what="outbox to drain")
    assert log_events(logs, "outbox_woken", channel="discord")
    assert len(chat_requests(model)) == 1


async def test_pairing_flow_with_the_cli(tmp_path, model, dc):
    cfg = config(tmp_path, model, dc, dm_policy="pairing")
    path = write_config(tmp_path, cfg)
    async with running_gateway(cfg):
        await dc.send_dm("hi, who are you?", user=dc.bob)
        dm = dc.dm_channels[dc.bob.id]
        [notice] = await until(lambda: texts(dc, dm), what="the pairing code")
        code = notice.split("pairing code is ")[1].split(".")[0]
        assert chat_requests(model) == []
        rc, out, _ = await run_cli(path, "pairing", "list", "--channel", "discord", "--json")
        [pending] = json.loads(out)
        assert (pending["code"], pending["sender_id"]) == (code, dc.bob.id)
        rc, out, _ = await run_cli(path, "pairing", "approve", "discord", code)
        assert rc == 0 and f"approved discord sender {dc.bob.id}" in out
        await dc.send_dm("may I ask now?", user=dc.bob)
        await until(lambda: "echo: may I ask now?" in texts(dc, dm), what="the answer")
    assert len(chat_requests(model)) == 1


async def test_denied_sender_is_logged_and_never_reaches_the_model(tmp_path, model, dc):
    cfg = config(tmp_path, model, dc, dm_policy="allowlist", allow_from=[dc.bob.id])
    with capture_logs() as logs:
        async with running_gateway(cfg):
            await dc.send_dm("let me in")
            await dc.send_dm("I am allowed", user=dc.bob)
            await until(lambda: posts(dc, dc.dm_channels[dc.bob.id]), what="bob's reply")
    assert [last_user_text(r)[-12:] for r in chat_requests(model)] == ["I am allowed"]
    assert posts(dc, dc.dm_channels[dc.alice.id]) == []
    [denied] = log_events(logs, "inbound_denied", sender_id=dc.alice.id)
    assert denied["reason"] == "not_in_allowlist" and denied["channel"] == "discord"


async def test_new_status_help_commands(tmp_path, model, dc):
    async with running_gateway(config(tmp_path, model, dc)) as gw:
        key = dm_key(dc.alice.id)
        await dc.send_dm("remember me")
        dm = dc.dm_channels[dc.alice.id]
        await until(lambda: posts(dc, dm), what="first reply")
        first_id = (await sessions_with(gw.state_dir, key))[key]["session_id"]
        await dc.send_dm("/help")
        await until(lambda: len(posts(dc, dm)) == 2, what="/help")
        assert "/new" in texts(dc, dm)[-1]
        await dc.send_dm("/status")
        await until(lambda: len(posts(dc, dm)) == 3, what="/status")
        assert f"Session: {key}" in texts(dc, dm)[-1] and first_id in texts(dc, dm)[-1]
        await dc.send_dm("/new")
        await until(lambda: len(posts(dc, dm)) == 4, what="/new")
        assert texts(dc, dm)[-1] == "Started a new session."
        await new_session_on_disk(gw.state_dir, key, first_id)
        await dc.send_guild("/help", mention=True)
        await until(lambda: posts(dc, dc.channel_id), what="/help in a channel")
        assert "/status" in texts(dc, dc.channel_id)[-1]
    assert len(chat_requests(model)) == 1


async def test_reactions_and_edits_become_system_events(tmp_path, model, dc):
    hook = EventHook()
    async with running_gateway(config(tmp_path, model, dc)) as gw:
        wired = gw.intake.on_channel_event

        def record(key: str, text: str, source: str, **kw) -> None:
            hook(key, text, source)
            if wired is not None:
                wired(key, text, source, **kw)
        gw.intake.on_channel_event = record
        asked = await dc.send_guild("hello", mention=True)
        await until(lambda: posts(dc, dc.channel_id), what="the reply")
        bot_msg = next(m for m in dc.messages.values()
                       if m["author"]["id"] == dc.bot.id and m["channel_id"] == dc.channel_id)
        await dc.react(bot_msg["id"], "🎉")
        in_dm = await dc.send_dm("original words")
        await until(lambda: posts(dc, dc.dm_channels[dc.alice.id]))
        await dc.edit(in_dm, "edited words")
        await dc.delete(asked)
        await until(lambda: len(hook.calls) == 3, what="three system events")
    got = {(s, k) for k, _, s in hook.calls}
    assert got == {("discord.reaction", group_key(dc)), ("discord.edit", dm_key(dc.alice.id)),
                   ("discord.delete", group_key(dc))}
    assert any("🎉" in t for _, t, _ in hook.calls)
    assert any("edited words" in t for _, t, _ in hook.calls)
    assert len(chat_requests(model)) == 2  # events never start a turn
