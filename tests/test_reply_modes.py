"""Reply modes and threading (issue 13): ``reply_to_mode`` off|first|all on Telegram and
Discord (which parts of a multi-part reply quote the triggering message), and Slack's
``reply_in_thread`` (a channel mention answered in its thread, the follow-up in that thread
continuing the same session) — all through the whole gateway against the fakes."""

from __future__ import annotations

import pytest

from tests.channel_harness import (
    chat_requests,
    last_user_text,
    long_reply,
    sessions_on_disk,
    sessions_with,
    until,
)
from tests.fakes.fake_discord import FakeDiscord
from tests.fakes.fake_slack import FakeSlack
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER = 4242


@pytest.mark.parametrize("mode,expect", [("off", "none"), ("first", "first"),
                                          ("all", "all")])
async def test_telegram_reply_to_mode(tmp_path, model, mode, expect):
    tg = await FakeTelegram().start()
    try:
        section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                   "poll_timeout": 1, "dm_policy": "open", "streaming": "off",
                   "reply_to_mode": mode}
        model.script_text(long_reply())
        async with running_gateway(base_config(tmp_path / "s", model.base_url,
                                               channels={"telegram": section})):
            update = tg.inject_message("the script", chat_id=USER, user_id=USER)
            await until(lambda: "That's all." in "".join(
                m["text"] for m in tg.bot_messages(USER)), what="every part")
        parts = [s["payload"] for s in tg.sent if s["method"] == "sendMessage"]
        assert len(parts) >= 3 and len(parts) == len(tg.bot_messages(USER))
        quoted = [(p.get("reply_parameters") or {}).get("message_id") for p in parts]
        mid = update["message"]["message_id"]
        want = {"none": [None] * len(parts), "first": [mid] + [None] * (len(parts) - 1),
                "all": [mid] * len(parts)}[expect]
        assert quoted == want
    finally:
        await tg.stop()


@pytest.mark.parametrize("mode", ["off", "all"])
async def test_discord_reply_to_mode(tmp_path, model, mode):
    dc = FakeDiscord()
    await dc.start()
    try:
        section = {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
                   "gateway_url": dc.gateway_url, "dm_policy": "open", "streaming": "off",
                   "reply_to_mode": mode}
        model.script_text(long_reply())
        async with running_gateway(base_config(tmp_path / "s", model.base_url,
                                               channels={"discord": section})):
            sent = await dc.send_dm("the script")
            dm = dc.dm_channels[dc.alice.id]
            await until(lambda: "That's all." in "".join(
                s["payload"]["content"] for s in dc.sent_messages(dm)), what="every part")
        refs = [str(r) if (r := (s["payload"].get("message_reference") or {}).get(
            "message_id")) else None
                for s in dc.sent_messages(dm)]
        assert len(refs) >= 5
        assert refs == ([None] * len(refs) if mode == "off" else [sent["id"]] * len(refs))
    finally:
        await dc.stop()


async def test_slack_channel_mention_answered_in_its_thread(tmp_path, model):
    async with FakeSlack() as slack:
        section = {"enabled": True, "bot_token": slack.bot_token,
                   "app_token": slack.app_token, "api_base_url": slack.api_url,
                   "dm_policy": "open", "group_policy": "allowlist", "groups": ["C0GENERAL"],
                   "streaming": "off"}
        model.script_text("First answer, in the thread.")
        model.script_text("Second answer, same thread.")
        async with running_gateway(base_config(tmp_path / "s", model.base_url,
                                               channels={"slack": section})) as gw:
            mention = slack.message(slack.mention_text("what's the tide?"))
            await slack.push_event(mention)
            [answer] = await until(lambda: slack.messages("C0GENERAL"), what="the answer")
            assert answer["thread_ts"] == mention["ts"]
            key = f"agent:main:slack:group:c0general:thread:{mention['ts']}"
            sid = (await sessions_with(gw.state_dir, key))[key]["session_id"]
            await slack.push_event(slack.message(slack.mention_text("and tomorrow?"),
                                                 thread_ts=mention["ts"]))
            await until(lambda: len(slack.messages("C0GENERAL")) == 2, what="the follow-up")
            assert slack.messages("C0GENERAL")[-1]["thread_ts"] == mention["ts"]
        # the follow-up ran in the same session, with the first exchange in its context
        assert sessions_on_disk(gw.state_dir)[key]["session_id"] == sid
        assert "agent:main:slack:group:c0general" not in sessions_on_disk(gw.state_dir)
        second = chat_requests(model)[-1]
        assert last_user_text(second).endswith("and tomorrow?")
        assert any("First answer, in the thread." in str(m.get("content"))
                   for m in second["messages"])
