"""``/model`` (issue 13 "Commands"): a per-session model override, validated against the
configured models, kept in the session entry (it survives a restart), ``default`` clears
it — through the whole gateway on Telegram, asserting what the model server was asked."""

from __future__ import annotations

import pytest

from tests.channel_harness import chat_requests, sessions_with, until
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER = 4242
KEY = f"agent:main:telegram:dm:{USER}"


async def test_model_override_is_validated_persisted_and_cleared(tmp_path):
    async with FakeOpenAI() as model:
        tg = await FakeTelegram().start()
        try:
            section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                       "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}
            cfg = base_config(tmp_path / "s", model.base_url, channels={"telegram": section})
            cfg["models"]["providers"]["fake"]["models"] = {"fake-large": {}}

            def texts() -> list[str]:
                return [m["text"] for m in tg.bot_messages(USER)]

            async with running_gateway(cfg) as gw:
                tg.inject_message("/model list", chat_id=USER, user_id=USER)
                await until(lambda: len(texts()) == 1, what="the list")
                assert "fake/fake-large" in texts()[0] and "fake/fake-model" in texts()[0]
                tg.inject_message("/model nope/unknown", chat_id=USER, user_id=USER)
                await until(lambda: len(texts()) == 2, what="the refusal")
                assert texts()[1].startswith("Unknown model 'nope/unknown'")
                tg.inject_message("/model fake/fake-large", chat_id=USER, user_id=USER)
                await until(lambda: len(texts()) == 3, what="the switch")
                tg.inject_message("hello", chat_id=USER, user_id=USER)
                await until(lambda: len(chat_requests(model)) == 1, what="a turn")
                assert chat_requests(model)[-1]["model"] == "fake-large"
                await until(lambda: (gw.agents["main"].store.get(KEY) or None)
                            and gw.agents["main"].store.get(KEY).model_override,
                            what="override in the entry")
            on_disk = await sessions_with(tmp_path / "s", KEY)
            assert on_disk[KEY]["model_override"] == "fake/fake-large"
            async with running_gateway(cfg):  # a restart keeps the session's choice
                tg.inject_message("after restart", chat_id=USER, user_id=USER)
                await until(lambda: len(chat_requests(model)) == 2, what="turn 2")
                assert chat_requests(model)[-1]["model"] == "fake-large"
                tg.inject_message("/model", chat_id=USER, user_id=USER)
                await until(lambda: any("this session's choice" in t for t in texts()),
                            what="the current model")
                tg.inject_message("/model default", chat_id=USER, user_id=USER)
                await until(lambda: any("reset to the agent's default" in t for t in texts()),
                            what="the reset")
                tg.inject_message("back to default", chat_id=USER, user_id=USER)
                await until(lambda: len(chat_requests(model)) == 3, what="turn 3")
                assert chat_requests(model)[-1]["model"] == "fake-model"
        finally:
            await tg.stop()


async def test_think_sets_reasoning_effort_per_session_and_survives_a_restart(tmp_path):
    async with FakeOpenAI() as model:
        tg = await FakeTelegram().start()
        try:
            section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                       "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}
            cfg = base_config(tmp_path / "s", model.base_url, channels={"telegram": section})

            def texts() -> list[str]:
                return [m["text"] for m in tg.bot_messages(USER)]

            async with running_gateway(cfg):
                tg.inject_message("/think lots", chat_id=USER, user_id=USER)
                await until(lambda: texts(), what="the refusal")
                assert texts()[0].startswith("Unknown level 'lots'")
                tg.inject_message("/think high", chat_id=USER, user_id=USER)
                await until(lambda: len(texts()) == 2, what="the switch")
                assert texts()[1] == "Thinking set to high for this session."
                tg.inject_message("think hard", chat_id=USER, user_id=USER)
                await until(lambda: len(chat_requests(model)) == 1, what="a turn")
                assert chat_requests(model)[-1]["reasoning_effort"] == "high"
            on_disk = await sessions_with(tmp_path / "s", KEY)
            assert on_disk[KEY]["think"] == "high"
            async with running_gateway(cfg):
                tg.inject_message("still?", chat_id=USER, user_id=USER)
                await until(lambda: len(chat_requests(model)) == 2, what="turn 2")
                assert chat_requests(model)[-1]["reasoning_effort"] == "high"
                tg.inject_message("/think off", chat_id=USER, user_id=USER)
                await until(lambda: any("set to off" in t for t in texts()), what="off")
                tg.inject_message("quick one", chat_id=USER, user_id=USER)
                await until(lambda: len(chat_requests(model)) == 3, what="turn 3")
                assert "reasoning_effort" not in chat_requests(model)[-1]
        finally:
            await tg.stop()


async def test_local_channels_take_command_arguments(tmp_path):
    """The CLI, webchat and API (the local channel) pass what follows the command word:
    ``/model <ref>``, ``/model list``, ``/think high`` act as on the chat platforms."""
    async with FakeOpenAI() as model:
        cfg = base_config(tmp_path / "s", model.base_url)
        cfg["models"]["providers"]["fake"]["models"] = {"fake-large": {}}
        async with running_gateway(cfg) as gw:
            assert (await gw.local.send("/model list")).text.startswith("Configured models:")
            assert (await gw.local.send("/model fake/fake-large")).text == \
                "Model for this session: fake/fake-large."
            assert (await gw.local.send("/think high")).text == \
                "Thinking set to high for this session."
            await gw.local.send("hello")
            assert chat_requests(model)[-1]["model"] == "fake-large"
            assert chat_requests(model)[-1]["reasoning_effort"] == "high"


async def test_think_on_a_model_without_reasoning_effort_answers_with_a_note(tmp_path):
    """A model that refuses ``reasoning_effort`` (400 "Unsupported parameter"): the turn is
    answered without it and says so once; later turns of the session do not fail and do
    not send the knob to that model again; the note never reaches the model."""
    async with FakeOpenAI() as model:
        model.no_reasoning_models.add("fake-model")
        model.push({"type": "text", "text": "First answer."})
        model.push({"type": "text", "text": "Second answer."})
        cfg = base_config(tmp_path / "s", model.base_url)
        async with running_gateway(cfg) as gw:
            await gw.local.send("/think high")
            first = await gw.local.send("think hard")
            second = await gw.local.send("and again")
    assert first.text == ("First answer.\n\n(/think high is not supported by fake-model: "
                          "answered without it.)")
    assert second.text == "Second answer."
    sent = chat_requests(model)
    # tried once (refused), retried without it, then remembered for this model
    assert [("reasoning_effort" in b) for b in sent] == [True, False, False]
    assert all("not supported" not in str(b["messages"]) for b in sent)
