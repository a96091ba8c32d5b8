"""Channel tools through the whole gateway: the real SlackChannel (slack-bolt + slack-sdk)
against the fake Slack, the fake model. ``react``/``pin`` exist only in turns from their
platforms and act on the message being answered; group rules narrow them (layer 7)."""

from __future__ import annotations

import pytest

from tests.channel_harness import until
from tests.helpers import base_config, running_gateway

pytestmark = pytest.mark.timeout(30)
CHANNEL = "C0GENERAL"


def config(tmp_path, model, slack, **extra):
    section = {"enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
               "api_base_url": slack.api_url, "dm_policy": "open",
               "group_policy": "allowlist", "groups": {CHANNEL: {}}, **extra}
    return base_config(tmp_path / "state", model.base_url, channels={"slack": section})


def offered(request) -> list[str]:
    return [t["function"]["name"] for t in request.json.get("tools") or []]


def calls(slack, method):
    return [c["payload"] for c in slack.sent if c["method"] == method]


async def test_react_and_pin_act_on_the_message_being_answered(tmp_path, model, slack):
    model.script_tool_calls([{"name": "react", "arguments": {"emoji": ":thumbsup:"}},
                             {"name": "pin", "arguments": {}}])
    model.script_text("Done.")
    async with running_gateway(config(tmp_path, model, slack)) as gw:
        event = slack.dm("pin this please")
        await slack.push_event(event)
        await until(lambda: slack.messages(), what="the reply")
        assert "react" in offered(model.requests[0]) and "pin" in offered(model.requests[0])
        assert "thread_create" not in offered(model.requests[0])  # Discord only
        [reaction] = calls(slack, "reactions.add")
        assert reaction["name"] == "thumbsup" and reaction["timestamp"] == event["ts"]
        assert reaction["channel"] == event["channel"]
        [pin] = calls(slack, "pins.add")
        assert pin["timestamp"] == event["ts"]
        results = [m["content"] for m in model.requests[-1].json["messages"]
                   if m["role"] == "tool"]
        assert results == [f"reacted :thumbsup: to {event['ts']}", f"pinned {event['ts']}"]
        # a local turn has no channel tools
        await gw.local.send("hello")
        assert not {"react", "pin"} & set(offered(model.requests[-1]))


async def test_group_rules_narrow_channel_tools(tmp_path, model, slack):
    model.script_tool_call("react", {"emoji": "eyes"})
    model.script_text("Cannot.")
    cfg = config(tmp_path, model, slack, groups={CHANNEL: {"tools": {"deny": ["group:channel"]}}})
    cfg.setdefault("messages", {})["ack_reaction"] = ""  # only the tool could react
    async with running_gateway(cfg):
        await slack.push_event(slack.message(slack.mention_text("react please")))
        await until(lambda: slack.messages(CHANNEL), what="the channel reply")
        assert not {"react", "pin"} & set(offered(model.requests[0]))
        assert "not allowed" in model.requests[-1].json["messages"][-1]["content"]
        assert calls(slack, "reactions.add") == []


async def test_telegram_react_and_pin(tmp_path, model):
    from tests.fakes.fake_telegram import FakeTelegram
    tg = await FakeTelegram().start()
    try:
        section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                   "poll_timeout": 1, "dm_policy": "open"}
        cfg = base_config(tmp_path / "state", model.base_url, channels={"telegram": section})
        model.script_tool_calls([{"name": "react", "arguments": {"emoji": "👍"}},
                                 {"name": "pin", "arguments": {}}])
        model.script_text("Done.")
        async with running_gateway(cfg):
            update = tg.inject_message("pin this", chat_id=4242, user_id=4242)
            await until(lambda: tg.bot_messages(4242), what="the reply")
            mid = update["message"]["message_id"]
            [react] = [s["payload"] for s in tg.sent if s["method"] == "setMessageReaction"]
            assert str(react["chat_id"]) == "4242" and int(react["message_id"]) == mid
            assert "👍" in str(react["reaction"])
            [pin] = [s["payload"] for s in tg.sent if s["method"] == "pinChatMessage"]
            assert int(pin["message_id"]) == mid
            assert "thread_create" not in offered(model.requests[0])
    finally:
        await tg.stop()


async def test_discord_react_pin_and_thread_create_in_a_group(tmp_path, model):
    from tests.fakes.fake_discord import FakeDiscord
    dc = FakeDiscord()
    await dc.start()
    try:
        section = {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
                   "gateway_url": dc.gateway_url, "dm_policy": "open",
                   "group_policy": "allowlist",
                   "groups": {dc.channel_id: {"tools": {"allow": ["group:channel"]}}}}
        cfg = base_config(tmp_path / "state", model.base_url, channels={"discord": section})
        model.script_tool_calls([
            {"name": "react", "arguments": {"emoji": "👍"}},
            {"name": "pin", "arguments": {}},
            {"name": "thread_create", "arguments": {"name": "Tide talk"}}])
        model.script_text("Done.")
        async with running_gateway(cfg):
            sent = await dc.send_guild("organise this", mention=True)
            await until(lambda: dc.sent_messages(dc.channel_id), what="the reply")
            assert offered(model.requests[0]) == ["react", "pin", "thread_create"]
            paths = [(s["method"], s["path"]) for s in dc.sent]
            base = f"/channels/{dc.channel_id}/messages/{sent['id']}"
            assert any(m == "PUT" and p.startswith(f"{base}/reactions/") for m, p in paths)
            assert ("PUT", f"/channels/{dc.channel_id}/messages/pins/{sent['id']}") in paths
            assert ("POST", f"{base}/threads") in paths
            results = [m["content"] for m in model.requests[-1].json["messages"]
                       if m["role"] == "tool"]
            assert results[:2] == [f"reacted 👍 to {sent['id']}", f"pinned {sent['id']}"]
            assert results[2].startswith("created thread Tide talk (")
    finally:
        await dc.stop()
