"""Per-group overrides and ``/activation`` (issue 13 "Group context and activation"):
``groups.<id>.require_mention`` and ``groups.<id>.system_prompt`` apply in their group
only; ``/activation always|mention`` flips the mention rule of one group at runtime, only
for owners (allowlisted or paired senders), and survives a restart — through the whole
gateway with the real python-telegram-bot against the fake Bot API."""

from __future__ import annotations

import json

import pytest

from channels.access.activation import ActivationStore
from tests.channel_harness import chat_requests, sessions_with, until
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

OWNER, OTHER = 4242, 5151
GROUP_A, GROUP_B = -1001, -1002
BOT = "@tidegate_test_bot"


def config(tmp_path, model, tg, **extra) -> dict:
    section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
               "poll_timeout": 1, "dm_policy": "open", "group_policy": "allowlist",
               "groups": {str(GROUP_A): {}, str(GROUP_B): {}}, "streaming": "off", **extra}
    return base_config(tmp_path / "s", model.base_url, channels={"telegram": section})


def asked(model) -> list[str]:
    return [r["messages"][-1]["content"] for r in chat_requests(model)]


async def test_activation_always_is_owner_only_and_survives_a_restart(tmp_path):
    async with FakeOpenAI() as model:
        tg = await FakeTelegram().start()
        try:
            cfg = config(tmp_path, model, tg, allow_from=[str(OWNER), str(OTHER)])
            async with running_gateway(cfg):
                tg.inject_message("unmentioned 1", chat_id=GROUP_A, user_id=OWNER)
                tg.inject_message("/activation always", chat_id=GROUP_A, user_id=OWNER)
                await until(lambda: any("every message" in t for t in tg.chat_view(GROUP_A)),
                            what="the switch")
                assert chat_requests(model) == []  # the unmentioned message was no turn
                tg.inject_message("now without mention", chat_id=GROUP_A, user_id=OTHER)
                await until(lambda: len(chat_requests(model)) == 1, what="a turn")
                assert "now without mention" in json.dumps(asked(model))
                tg.inject_message("group b unmentioned", chat_id=GROUP_B, user_id=OWNER)
                tg.inject_message(f"{BOT} mentioned in b", chat_id=GROUP_B, user_id=OWNER)
                await until(lambda: len(chat_requests(model)) == 2, what="group b turn")
                assert "group b unmentioned" not in asked(model)[-1].split("\n")[-1]
            stored = json.loads((tmp_path / "s" / "channels" / "activation.json").read_text())
            assert stored == {f"telegram:default:{GROUP_A}": "always"}
            async with running_gateway(cfg):  # kept across the restart
                tg.inject_message("after restart", chat_id=GROUP_A, user_id=OWNER)
                await until(lambda: len(chat_requests(model)) == 3, what="turn after restart")
                tg.inject_message("/activation mention", chat_id=GROUP_A, user_id=OWNER)
                await until(lambda: any("only when mentioned" in t
                                        for t in tg.chat_view(GROUP_A)), what="back")
                tg.inject_message("quiet again", chat_id=GROUP_A, user_id=OWNER)
                tg.inject_message(f"{BOT} ping", chat_id=GROUP_A, user_id=OWNER)
                await until(lambda: len(chat_requests(model)) == 4, what="mentioned turn")
                assert "ping" in asked(model)[-1]
        finally:
            await tg.stop()


async def test_activation_refused_for_a_sender_who_is_not_an_owner(tmp_path):
    async with FakeOpenAI() as model:
        tg = await FakeTelegram().start()
        try:
            async with running_gateway(config(tmp_path, model, tg)):  # allow_from: anyone
                tg.inject_message("/activation always", chat_id=GROUP_A, user_id=OTHER)
                await until(lambda: tg.chat_view(GROUP_A), what="the refusal")
                assert "Only the bot's owner" in tg.chat_view(GROUP_A)[0]
                tg.inject_message("unmentioned", chat_id=GROUP_A, user_id=OTHER)
                tg.inject_message(f"{BOT} mentioned", chat_id=GROUP_A, user_id=OTHER)
                await until(lambda: len(chat_requests(model)) == 1, what="mentioned turn")
            assert not (tmp_path / "s" / "channels" / "activation.json").exists()
        finally:
            await tg.stop()


async def test_a_command_for_another_bot_is_not_ours(tmp_path):
    """Several bots in one group: ``/activation@other_bot always`` is that bot's command;
    ``/activation@<this bot>`` is ours."""
    async with FakeOpenAI() as model:
        tg = await FakeTelegram().start()
        try:
            cfg = config(tmp_path, model, tg, allow_from=[str(OWNER)])
            async with running_gateway(cfg):
                tg.inject_message("/activation@some_other_bot always", chat_id=GROUP_A,
                                  user_id=OWNER)
                tg.inject_message(f"{BOT} hi", chat_id=GROUP_A, user_id=OWNER)
                await until(lambda: tg.chat_view(GROUP_A), what="the mentioned turn's reply")
                assert not any("every message" in t for t in tg.chat_view(GROUP_A))
                assert not (tmp_path / "s" / "channels" / "activation.json").exists()
                tg.inject_message(f"/activation{BOT} always", chat_id=GROUP_A, user_id=OWNER)
                await until(lambda: any("every message" in t for t in tg.chat_view(GROUP_A)),
                            what="our own command")
        finally:
            await tg.stop()


async def test_group_overrides_apply_to_their_group_only(tmp_path):
    async with FakeOpenAI() as model:
        tg = await FakeTelegram().start()
        try:
            groups = {str(GROUP_A): {"require_mention": False,
                                     "system_prompt": "Answer in rhymes."},
                      str(GROUP_B): {}}
            async with running_gateway(config(tmp_path, model, tg, groups=groups)):
                tg.inject_message("no mention needed", chat_id=GROUP_A, user_id=OTHER)
                await until(lambda: len(chat_requests(model)) == 1, what="group a turn")
                system_a = json.dumps(chat_requests(model)[0]["messages"][:2])
                assert "Answer in rhymes." in system_a
                tg.inject_message("b unmentioned", chat_id=GROUP_B, user_id=OTHER)
                tg.inject_message(f"{BOT} b mentioned", chat_id=GROUP_B, user_id=OTHER)
                await until(lambda: len(chat_requests(model)) == 2, what="group b turn")
                assert "Answer in rhymes." not in json.dumps(chat_requests(model)[1])
        finally:
            await tg.stop()


def test_corrupt_activation_file_disables_only_itself(tmp_path):
    path = tmp_path / "activation.json"
    path.write_text("{not json")
    problems: list[str] = []
    store = ActivationStore(path, problems)
    assert store.get("telegram", "default", "-1") is None and problems
    assert (tmp_path / "activation.json.corrupt").read_text() == "{not json"
    store.set("telegram", "default", "-1", "always")
    assert ActivationStore(path).get("telegram", "default", "-1") == "always"


async def test_group_dm_scope_puts_each_sender_in_their_dm_session(tmp_path):
    async with FakeOpenAI() as model:
        tg = await FakeTelegram().start()
        try:
            groups = {str(GROUP_A): {"dm_scope": "per-channel-peer",
                                     "require_mention": False},
                      str(GROUP_B): {"require_mention": False}}
            async with running_gateway(config(tmp_path, model, tg, groups=groups)) as gw:
                tg.inject_message("my plan is the blue boat", chat_id=OWNER, user_id=OWNER)
                await until(lambda: len(chat_requests(model)) == 1, what="the DM turn")
                tg.inject_message("which boat was it?", chat_id=GROUP_A, user_id=OWNER)
                await until(lambda: len(chat_requests(model)) == 2, what="owner in group a")
                assert "the blue boat" in json.dumps(chat_requests(model)[1]["messages"])
                await until(lambda: tg.chat_view(GROUP_A), what="the reply in group a")
                tg.inject_message("and mine?", chat_id=GROUP_A, user_id=OTHER)
                await until(lambda: len(chat_requests(model)) == 3, what="other in group a")
                assert "blue boat" not in json.dumps(chat_requests(model)[2]["messages"])
                tg.inject_message("shared here", chat_id=GROUP_B, user_id=OWNER)
                await until(lambda: len(chat_requests(model)) == 4, what="group b turn")
                assert "blue boat" not in json.dumps(chat_requests(model)[3]["messages"])
                keys = set(await sessions_with(
                    gw.state_dir, f"agent:main:telegram:dm:{OWNER}",
                    f"agent:main:telegram:dm:{OTHER}", f"agent:main:telegram:group:{GROUP_B}"))
                assert f"agent:main:telegram:group:{GROUP_A}" not in keys
                # both answers went to the group (the second may still be on its way)
                await until(lambda: len(tg.chat_view(GROUP_A)) == 2, what="both replies in a")
        finally:
            await tg.stop()
