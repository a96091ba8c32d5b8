"""Replies are delivered once (issue 8 items 4-5), through the whole gateway against the
fake platforms and the fake model: a turn that already messaged its own reply target
with the ``message`` tool does not deliver its final text there again, and a send the
platform accepted but never answered is not blindly resent (Telegram: unconfirmed;
Discord: resent with the same nonce; Slack: looked up first)."""

from __future__ import annotations

import aiohttp
import pytest
from structlog.testing import capture_logs

from channels.discord.send import part_nonce
from channels.outbound.render import render_chunks
from gateway.journal.store import FILE_NAME as JOURNAL_FILE
from gateway.journal.store import IntakeJournal
from gateway.journal.tracking import work_to_dict
from gateway.routing import Route
from gateway.turns.work import UserWork
from runtime.clock import SYSTEM_CLOCK
from tests.channel_harness import chat_requests, log_events, outbox_files, until
from tests.fakes.fake_discord import FakeDiscord
from tests.fakes.fake_slack import FakeSlack
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

pytestmark = [
    pytest.mark.timeout(40),
    pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning"),
]

USER = 4242
DIGEST = "Daily digest: three new issues, one release."


def tg_config(tmp_path, model, tg) -> dict:
    return base_config(tmp_path / "state", model.base_url, channels={"telegram": {
        "enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
        "poll_timeout": 1, "dm_policy": "open"}})


def texts(tg: FakeTelegram) -> list[str]:
    return [m["text"] for m in tg.bot_messages(USER)]


async def test_chat_turn_that_messaged_its_own_chat_does_not_answer_twice(tmp_path, model, tg):
    async with running_gateway(tg_config(tmp_path, model, tg)) as gw:
        model.script_tool_call("message", {"channel": "telegram", "to": str(USER),
                                           "text": "Here is the summary."})
        model.script_text("Here is the summary.")
        with capture_logs() as logs:
            tg.inject_message("summarise please", chat_id=USER, user_id=USER)
            await until(lambda: len(chat_requests(model)) == 2, timeout=20, what="both model calls")
            await until(lambda: log_events(logs, "turn_done"), what="the turn")
        assert texts(tg) == ["Here is the summary."]
        [suppressed] = log_events(logs, "reply_suppressed")
        assert suppressed["session_key"] == f"agent:main:telegram:dm:{USER}"
        log = gw.agents["main"].store.get(suppressed["session_key"])
        rows = (gw.state_dir / "agents/main/sessions" / f"{log.session_id}.jsonl").read_text()
        assert rows.count("Here is the summary.") == 2  # tool argument + final text kept


async def test_chat_turn_that_messaged_its_own_chat_sends_no_second_final_text(
        tmp_path, model, tg):
    """A different final text after a message-tool send to the turn's own chat used to
    be a second message in the same DM (A-TOOL-MSG, then A-FINAL-TEXT)."""
    async with running_gateway(tg_config(tmp_path, model, tg)) as gw:
        model.script_tool_call("message", {"channel": "telegram", "to": str(USER),
                                           "text": "A-TOOL-MSG"})
        model.script_text("A-FINAL-TEXT")
        tg.inject_message("do it", chat_id=USER, user_id=USER)
        await until(lambda: len(gw.journal.outcomes) == 1, what="the outcome")
        [row] = gw.journal.outcomes.select()
        assert (row["outcome"], row["detail"]) == ("replied", "sent with the message tool")
    assert texts(tg) == ["A-TOOL-MSG"]


@pytest.mark.parametrize("chat", [USER, -1001234567890])
async def test_a_final_text_answered_by_the_message_tool_is_not_streamed(tmp_path, model, tg,
                                                                         chat):
    """The suppressed final text used to stream first (a Telegram draft in a DM, a posted
    and deleted message in a group): the user saw it flash."""
    cfg = tg_config(tmp_path, model, tg)
    cfg["channels"]["telegram"].update(group_policy="open", require_mention=False,
                                       streaming="partial")
    async with running_gateway(cfg) as gw:
        model.script_tool_call("message", {"text": "A-TOOL-MSG"})  # this conversation
        model.script_text("A-FINAL-TEXT")
        tg.inject_message("do it", chat_id=chat, user_id=USER)
        await until(lambda: len(gw.journal.outcomes) == 1, what="the outcome")
        [row] = gw.journal.outcomes.select()
        assert (row["outcome"], row["detail"]) == ("replied", "sent with the message tool")
    shown = [s for s in tg.sent if "A-FINAL-TEXT" in str(s["payload"].get("text"))]
    assert shown == []
    assert [m["text"] for m in tg.bot_messages(chat)] == ["A-TOOL-MSG"]


async def test_message_to_another_chat_still_gets_the_final_answer(tmp_path, model, tg):
    async with running_gateway(tg_config(tmp_path, model, tg)):
        model.script_tool_call("message", {"channel": "telegram", "to": "1001",
                                           "text": "FYI"})
        model.script_text("Told them.")
        tg.inject_message("tell 1001", chat_id=USER, user_id=USER)
        await until(lambda: texts(tg) == ["Told them."], what="the final answer")
        assert [m["text"] for m in tg.bot_messages(1001)] == ["FYI"]


async def test_cron_digest_sent_by_the_message_tool_is_delivered_once(tmp_path, model, tg):
    async with running_gateway(tg_config(tmp_path, model, tg)) as gw:
        model.script_tool_call("message", {"channel": "telegram", "to": "1001",
                                           "text": DIGEST})
        model.script_text(DIGEST)
        headers = {"Authorization": f"Bearer {gw.token}"}
        base = f"http://127.0.0.1:{gw.port}/api/cron"
        async with aiohttp.ClientSession(headers=headers) as s:
            async with s.post(base, json={
                    "name": "digest", "schedule": {"kind": "every", "interval": "24h"},
                    "message": "send the daily digest", "session_target": "isolated",
                    "delivery": "telegram:1001"}) as r:
                job = await r.json()
            async with s.post(f"{base}/{job['id']}/run") as r:
                outcome = await r.json()
        assert r.status == 200, outcome
        await until(lambda: len(chat_requests(model)) == 2, timeout=20, what="the cron turn")
        assert [m["text"] for m in tg.bot_messages(1001)] == [DIGEST]


async def test_telegram_send_accepted_but_unanswered_is_not_sent_again(tmp_path, model, tg):
    async with running_gateway(tg_config(tmp_path, model, tg)) as gw:
        tg.drop_after_accept("sendMessage")
        model.script_text("the only copy")
        with capture_logs() as logs:
            tg.inject_message("hello", chat_id=USER, user_id=USER)
            await until(lambda: log_events(logs, "delivery_unconfirmed"), what="the send")
        gw.outbox.wake("telegram")
        await until(lambda: gw.status()["delivery"]["unconfirmed"] == 1, what="status")
        assert outbox_files(gw.state_dir) == []
        assert texts(tg) == ["the only copy"]
        [rec] = log_events(logs, "delivery_unconfirmed")
        assert rec["session_key"] == f"agent:main:telegram:dm:{USER}"
        recent = gw.status()["delivery"]["unconfirmed_recent"]
        assert [(u["channel"], u["to"]) for u in recent] == [("telegram", str(USER))]
        tg.inject_message("still there?", chat_id=USER, user_id=USER)
        await until(lambda: len(texts(tg)) == 2, what="the next reply")
        assert texts(tg) == ["the only copy", "echo: still there?"]


async def test_telegram_connect_failure_is_retried_from_the_outbox(tmp_path, model, tg):
    async with running_gateway(tg_config(tmp_path, model, tg)) as gw:
        tg.fail("sendMessage", status=502, count=1)  # refused: certainly not delivered
        model.script_text("retry me")
        tg.inject_message("hello", chat_id=USER, user_id=USER)
        await until(lambda: outbox_files(gw.state_dir), what="the outbox entry")
        gw.outbox.wake("telegram")
        await until(lambda: texts(tg) == ["retry me"], timeout=15, what="the retry")
        assert gw.status()["delivery"]["unconfirmed"] == 0


async def test_discord_send_without_answer_is_resent_with_the_same_nonce(tmp_path, model):
    dc = FakeDiscord()
    await dc.start()
    try:
        cfg = base_config(tmp_path / "state", model.base_url, channels={"discord": {
            "enabled": True, "token": dc.token, "api_base_url": dc.api_url,
            "gateway_url": dc.gateway_url, "dm_policy": "open"}})
        async with running_gateway(cfg) as gw:
            await until(lambda: dc.connected, what="discord connected")
            dc.fail_next_sends(1, "drop")
            model.script_text("exactly once")
            await dc.send_dm("hi")
            dm = dc.dm_channels[dc.alice.id]
            await until(lambda: dc.nonce_replays == 1, what="the idempotent resend")
            await until(lambda: gw.deliverer.sent == 1, what="the delivery")
            assert [m["content"] for m in dc.messages.values()
                    if m["channel_id"] == dm and m["author"]["id"] == dc.bot.id] == \
                ["exactly once"]
            assert gw.status()["delivery"]["unconfirmed"] == 0
    finally:
        await dc.stop()


async def test_slack_send_without_answer_is_looked_up_not_doubled(tmp_path, model):
    async with FakeSlack() as slack:
        cfg = base_config(tmp_path / "state", model.base_url, channels={"slack": {
            "enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
            "api_base_url": slack.api_url, "dm_policy": "open"}})
        async with running_gateway(cfg) as gw:
            await until(lambda: slack.connected_sockets, what="slack connected")
            slack.fail_next("chat.postMessage", kind="drop")
            model.script_text("posted once")
            with capture_logs() as logs:
                await slack.push_event(slack.dm("hi"))
                await until(lambda: gw.deliverer.sent == 1, what="the delivery")
            posts = [s["payload"]["text"] for s in slack.sent
                     if s["method"] == "chat.postMessage"]
            assert posts == ["posted once"]
            assert log_events(logs, "slack_send_confirmed_by_lookup")
            assert any(c["method"] == "conversations.history" for c in slack.calls)


# -- a crash while the reply was being sent ------------------------------------------------

REPLY = "All done."


def crashed_mid_reply(state, session_key: str, route: Route) -> str:
    """The journal a crash leaves when it came while REPLY was being sent; returns the
    entry id (the reply's idempotency key)."""
    journal = IntakeJournal(state / JOURNAL_FILE, SYSTEM_CLOCK)
    journal.load()
    work = UserWork(agent_id="main", text="do it", channel=route.channel, route=route,
                    message_id="m1")
    entry = journal.accept(session_key, work_to_dict(work))
    journal.started([entry.id], "run-before-crash")
    journal.replying([entry.id], REPLY, entry.id)
    journal.close()
    return entry.id


async def test_reply_cut_by_a_crash_is_looked_up_on_slack_not_doubled(tmp_path, model):
    async with FakeSlack() as slack:
        state = tmp_path / "state"
        crashed_mid_reply(state, "agent:main:slack:dm:u0alice", Route("slack", "U0ALICE"))
        async with aiohttp.ClientSession() as s:  # it did reach Slack before the crash
            await s.post(f"{slack.api_url}chat.postMessage", data={
                "channel": "U0ALICE", "text": REPLY},
                headers={"Authorization": f"Bearer {slack.bot_token}"})
        assert len(slack.sent) == 1
        cfg = base_config(state, model.base_url, channels={"slack": {
            "enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
            "api_base_url": slack.api_url, "dm_policy": "open"}})
        with capture_logs() as logs:
            async with running_gateway(cfg):
                pass
        assert [s["payload"]["text"] for s in slack.sent] == [REPLY]
        assert [c["method"] for c in slack.calls if c["method"].startswith("conv")] == [
            "conversations.open", "conversations.history"]
        [rec] = log_events(logs, "journal_entry_resumed")
        assert (rec["action"], rec["delivery"]) == ("reply", "delivered")
        assert chat_requests(model) == []  # the turn is not run again


async def test_reply_cut_by_a_crash_before_it_reached_slack_is_posted(tmp_path, model):
    async with FakeSlack() as slack:
        state = tmp_path / "state"
        crashed_mid_reply(state, "agent:main:slack:dm:u0alice", Route("slack", "U0ALICE"))
        cfg = base_config(state, model.base_url, channels={"slack": {
            "enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
            "api_base_url": slack.api_url, "dm_policy": "open"}})
        async with running_gateway(cfg):
            pass
        assert [s["payload"]["text"] for s in slack.sent] == [REPLY]


async def test_reply_cut_by_a_crash_is_resent_on_discord_with_its_nonce(tmp_path, model):
    dc = FakeDiscord()
    await dc.start()
    try:
        state = tmp_path / "state"
        key = crashed_mid_reply(state, f"agent:main:discord:dm:{dc.alice.id}",
                                Route("discord", dc.alice.id))
        dm = dc.dm_channel_for(dc.alice)
        text = render_chunks(REPLY, "discord")[0].formatted
        async with aiohttp.ClientSession() as s:  # it did reach Discord before the crash
            await s.post(f"{dc.api_url}/channels/{dm}/messages",
                         json={"content": text, "nonce": part_nonce(key, text),
                               "enforce_nonce": True},
                         headers={"Authorization": f"Bot {dc.token}"})
        assert len(dc.messages) == 1
        cfg = base_config(state, model.base_url, channels={"discord": {
            "enabled": True, "token": dc.token, "api_base_url": dc.api_url,
            "gateway_url": dc.gateway_url, "dm_policy": "open"}})
        async with running_gateway(cfg):
            pass
        assert dc.nonce_replays == 1
        assert [m["content"] for m in dc.messages.values() if m["channel_id"] == dm] == [REPLY]
    finally:
        await dc.stop()


async def test_reply_cut_by_a_crash_on_telegram_is_unconfirmed(tmp_path, model, tg):
    state = tmp_path / "state"
    crashed_mid_reply(state, f"agent:main:telegram:dm:{USER}", Route("telegram", str(USER)))
    with capture_logs() as logs:
        async with running_gateway(tg_config(tmp_path, model, tg)) as gw:
            assert gw.status()["delivery"]["unconfirmed"] == 1
    assert texts(tg) == []
    [rec] = log_events(logs, "journal_entry_abandoned")
    assert (rec["delivery"], rec["session_key"]) == ("unconfirmed",
                                                     f"agent:main:telegram:dm:{USER}")


async def test_message_tool_channel_with_account_form(tmp_path, model, tg):
    """``channel: "telegram:default"`` names the platform and its account (it used to be
    read as chat ``default``, thread ``1001``)."""
    async with running_gateway(tg_config(tmp_path, model, tg)):
        model.script_tool_call("message", {"channel": "telegram:default", "to": "1001",
                                           "text": "FYI via account"})
        model.script_text("Told them.")
        tg.inject_message("tell 1001", chat_id=USER, user_id=USER)
        await until(lambda: texts(tg) == ["Told them."], what="the final answer")
        assert [m["text"] for m in tg.bot_messages(1001)] == ["FYI via account"]
    assert Route.from_tool("slack:work", "C1:1700.1") == Route("slack", "C1", "work", "1700.1")
    with pytest.raises(ValueError):
        Route.from_tool("telegram:", "1")


async def test_a_permanent_refusal_ends_failed_with_one_error_not_in_the_outbox(
        tmp_path, model, tg):
    """``chat not found`` (the bot was removed, the chat deleted) will never succeed: it
    used to be queued in the outbox and retried; it ends as ``failed`` with one ERROR
    naming the chat."""
    async with running_gateway(tg_config(tmp_path, model, tg)) as gw:
        for method in ("sendMessageDraft", "sendMessage"):
            tg.fail(method, status=400, count=50, description="Bad Request: chat not found")
        model.script_text("A reply nobody can receive, streamed in several words")
        with capture_logs() as logs:
            tg.inject_message("hello", chat_id=USER, user_id=USER)
            await until(lambda: len(gw.journal.outcomes) == 1, what="the outcome")
        [row] = gw.journal.outcomes.select()
        assert row["outcome"] == "failed" and "chat not found" in row["detail"].lower()
        assert gw.outbox.pending() == 0 and outbox_files(gw.state_dir) == []
        errors = [e for e in logs if e["log_level"] == "error"]
        assert [(e["event"], e.get("to")) for e in errors] == [("delivery_failed", str(USER))]
