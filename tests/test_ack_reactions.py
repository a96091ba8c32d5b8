"""Reactions as acknowledgements (issue 13), through the whole gateway: the ack emoji is
set on the triggering message when its turn starts and removed at the end, the done emoji
set then, a silent reply leaves no reaction, a failing reaction never affects the reply —
on Telegram (setMessageReaction), Slack (reactions.add/remove) and Discord."""

from __future__ import annotations

import pytest

from gateway.outbound.reactions import ack_applies
from tests.channel_harness import chat_requests, until
from tests.fakes.fake_discord import FakeDiscord
from tests.fakes.fake_slack import FakeSlack
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER = 4242


def test_scopes():
    assert ack_applies("all", "dm") and ack_applies("all", "group")
    assert ack_applies("dms", "dm") and not ack_applies("dms", "group")
    assert ack_applies("group-mentions", "thread") and not ack_applies("group-mentions", "dm")
    assert not ack_applies("off", "dm")


def reactions(tg: FakeTelegram) -> list[tuple[int, list[str]]]:
    return [(s["payload"]["message_id"], [r["emoji"] for r in s["payload"].get("reaction")
                                          or []])
            for s in tg.sent if s["method"] == "setMessageReaction"]


async def test_telegram_ack_set_then_removed_and_done_set(tmp_path, model):
    tg = await FakeTelegram().start()
    try:
        section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                   "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}
        cfg = base_config(tmp_path / "s", model.base_url, channels={"telegram": section},
                          messages={"ack_reaction_scope": "all", "done_reaction": "👍"})
        model.script_text("The answer.", delay=0.3)
        model.script_text("NO_REPLY")
        async with running_gateway(cfg):
            first = tg.inject_message("question", chat_id=USER, user_id=USER)
            mid = first["message"]["message_id"]
            await until(lambda: reactions(tg), what="the ack")
            assert reactions(tg) == [(mid, ["👀"])] and not tg.bot_messages(USER)
            await until(lambda: len(reactions(tg)) == 3, what="ack removed, done set")
            assert reactions(tg) == [(mid, ["👀"]), (mid, []), (mid, ["👍"])]
            assert [m["text"] for m in tg.bot_messages(USER)] == ["The answer."]
            second = tg.inject_message("nothing to say?", chat_id=USER, user_id=USER)
            await until(lambda: len(reactions(tg)) == 5, what="the silent turn's ack")
            await until(lambda: len(chat_requests(model)) == 2, what="silent turn")
            mid2 = second["message"]["message_id"]
            assert reactions(tg)[3:] == [(mid2, ["👀"]), (mid2, [])]  # no done emoji
            # a platform refusing reactions never affects the reply
            tg.fail("setMessageReaction", status=400, count=10,
                    description="Bad Request: REACTION_INVALID")
            model.script_text("Still answered.")
            tg.inject_message("again", chat_id=USER, user_id=USER)
            await until(lambda: len(tg.bot_messages(USER)) == 2, what="the reply")
            assert tg.bot_messages(USER)[-1]["text"] == "Still answered."
    finally:
        await tg.stop()


async def test_group_mentions_scope_skips_dms(tmp_path, model):
    tg = await FakeTelegram().start()
    try:
        section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                   "poll_timeout": 1, "dm_policy": "open", "streaming": "off",
                   "group_policy": "open"}
        cfg = base_config(tmp_path / "s", model.base_url, channels={"telegram": section},
                          messages={"done_reaction": "👍"})
        async with running_gateway(cfg):  # default scope: group-mentions, for done too
            tg.inject_message("dm", chat_id=USER, user_id=USER)
            await until(lambda: tg.bot_messages(USER), what="the DM reply")
            tg.inject_message("@tidegate_test_bot hi", chat_id=-100777, user_id=USER)
            await until(lambda: tg.bot_messages(-100777), what="the group reply")
            await until(lambda: len(reactions(tg)) == 3, what="group ack, removal, done")
        assert {s["payload"]["chat_id"] for s in tg.sent
                if s["method"] == "setMessageReaction"} == {-100777}
    finally:
        await tg.stop()


async def test_slack_and_discord_acks(tmp_path, model):
    dc = FakeDiscord()
    await dc.start()
    async with FakeSlack() as slack:
        try:
            channels = {
                "discord": {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
                            "gateway_url": dc.gateway_url, "dm_policy": "open",
                            "streaming": "off"},
                "slack": {"enabled": True, "bot_token": slack.bot_token,
                          "app_token": slack.app_token, "api_base_url": slack.api_url,
                          "dm_policy": "open", "streaming": "off"}}
            cfg = base_config(tmp_path / "s", model.base_url, channels=channels,
                              messages={"ack_reaction_scope": "all", "done_reaction": "✅"})
            async with running_gateway(cfg):
                sent = await dc.send_dm("hello")
                await until(lambda: dc.bot_reactions.get(sent["id"]) == ["✅"],
                            what="discord: ack replaced by done")
                calls = [(s["method"], s["path"].rsplit("/", 2)[-2]) for s in dc.sent
                         if "/reactions/" in s["path"]]
                assert [m for m, _ in calls] == ["PUT", "DELETE", "PUT"]
                event = slack.dm("hello")
                await slack.push_event(event)
                await until(lambda: [s["method"] for s in slack.sent if "reactions" in
                                     s["method"]] == ["reactions.add", "reactions.remove",
                                                      "reactions.add"], what="slack")
                names = [(s["payload"]["name"], s["payload"]["timestamp"]) for s in slack.sent
                         if "reactions" in s["method"]]
                assert names == [("eyes", event["ts"]), ("eyes", event["ts"]),
                                 ("white_check_mark", event["ts"])]
        finally:
            await dc.stop()
