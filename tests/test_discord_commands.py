"""Discord application commands (issue 13 "Commands, natively registered") through the
whole gateway: the real DiscordChannel (discord.py ``app_commands``) against the fake
Discord's command registry, INTERACTION_CREATE, interaction callbacks and webhook
follow-ups (tests/fakes/fake_discord/interactions.py), and the fake OpenAI model.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from channels.inbound.commands import CATALOGUE
from tests.channel_harness import chat_requests, sessions_with, until
from tests.fakes.fake_discord import FakeDiscord
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway

pytestmark = pytest.mark.timeout(40)
NAMES = sorted(c.name for c in CATALOGUE)


def config(tmp_path: Path, model: FakeOpenAI, dc: FakeDiscord, **extra: Any) -> dict:
    section = {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
               "gateway_url": dc.gateway_url, "dm_policy": "open",
               "group_policy": "allowlist", "groups": [dc.channel_id], "streaming": "off",
               **extra}
    return base_config(tmp_path / "state", model.base_url, channels={"discord": section})


def channel_posts(dc: FakeDiscord) -> list[dict[str, Any]]:
    return dc.sent_messages()


async def registered(dc: FakeDiscord, guild_id: str | None) -> None:
    await until(lambda: sorted(dc.interactions.registered(guild_id)) == NAMES,
                what=f"commands registered for {guild_id or 'global'}")


async def answered(record: Any) -> str:
    await until(lambda: record.responses and record.responses[0], what=f"/{record.name}")
    return "\n".join(record.responses)


async def test_guild_sync_and_ephemeral_answers(tmp_path, model, dc):
    async with running_gateway(config(tmp_path, model, dc, guild_ids=[dc.guild_id])):
        await registered(dc, dc.guild_id)
        assert dc.interactions.registered(None) == []  # guild sync only, no global set
        think = next(c for c in dc.interactions.commands[dc.guild_id] if c["name"] == "think")
        [option] = think["options"]
        assert [c["value"] for c in option["choices"]] == ["off", "low", "medium", "high"]
        activation = next(c for c in dc.interactions.commands[dc.guild_id]
                          if c["name"] == "activation")
        assert activation["dm_permission"] is False and activation["contexts"] == [0]

        help_ = await dc.interactions.invoke("help")  # in #general: no mention needed
        text = await answered(help_)
        assert "/new" in text and "/model" in text
        assert help_.ephemeral and help_.callback["type"] == 5
        assert help_.callback_at < 3.0  # deferred inside Discord's 3 s
        assert channel_posts(dc) == []  # nobody else saw it

        with pytest.raises(ValueError):  # guild commands are not offered in DMs
            await dc.interactions.invoke("status", guild=False)
        status = await dc.interactions.invoke("status")
        assert f"Session: agent:main:discord:group:{dc.channel_id}" in await answered(status)
        listing = await dc.interactions.invoke("model", "list")
        assert "fake/fake-model" in await answered(listing)
        think_hi = await dc.interactions.invoke("think", "high")
        assert "Thinking set to high" in await answered(think_hi)
        assert channel_posts(dc) == [] and chat_requests(model) == []


async def test_global_sync_model_survives_restart_and_stop(tmp_path, model, dc):
    cfg = config(tmp_path, model, dc)
    key = f"agent:main:discord:dm:{dc.alice.id}"
    async with running_gateway(cfg) as gw:
        await registered(dc, None)
        chosen = await dc.interactions.invoke("model", "fake/fake-model", guild=False)
        assert await answered(chosen) == "Model for this session: fake/fake-model."
        entry = (await sessions_with(gw.state_dir, key))[key]
        assert entry["model_override"] == "fake/fake-model"

        model.script_text("a slow answer", delay=20)
        await dc.send_dm("take your time")
        await until(lambda: len(chat_requests(model)) == 1, what="the turn to start")
        stop = await dc.interactions.invoke("stop", guild=False)
        assert (await answered(stop)).startswith("Stopped.")
        await asyncio.sleep(0.3)
        dm = dc.dm_channels[dc.alice.id]
        assert "a slow answer" not in [p["payload"].get("content") for p in
                                       dc.sent_messages(dm)]
    async with running_gateway(cfg):
        await until(lambda: len(dc.interactions.registrations) == 2, what="re-registered")
        shown = await dc.interactions.invoke("model", guild=False)
        assert "fake/fake-model (this session's choice)" in await answered(shown)


async def test_native_commands_off_registers_nothing(tmp_path, model, dc):
    async with running_gateway(config(tmp_path, model, dc, native_commands=False)) as gw:
        await until(lambda: gw.status()["channels"]["discord"]["state"] == "connected",
                    what="connected")
        await dc.send_dm("/help")  # typed commands still work
        await until(lambda: channel_posts(dc), what="/help typed")
        assert dc.interactions.registrations == []


# ---------------------------------------------------------------------- adapter level


async def adapter(dc: FakeDiscord, clock: Any, inbox: list) -> Any:
    from channels.discord.adapter import DiscordChannel
    from channels.discord.config import DiscordAccount

    async def on_message(m: Any) -> None:
        inbox.append(m)

    async def on_event(e: Any) -> None:
        pass

    cfg = DiscordAccount(token=dc.token, api_base_url=dc.api_url, gateway_url=dc.gateway_url,
                         send_timeout=10)
    ch = DiscordChannel("default", cfg, clock=clock, guild_ready_timeout=0.05,
                        start_timeout=10)
    await ch.start(on_message, on_event)
    return ch


async def test_invocation_becomes_a_command_and_long_answers_follow_up(dc):
    from channels.base import OutboundMessage
    from runtime.clock import FakeClock
    inbox: list = []
    ch = await adapter(dc, FakeClock(), inbox)
    try:
        await registered(dc, None)
        record = await dc.interactions.invoke("verbose", "on", user=dc.bob)
        [msg] = await until(lambda: inbox, what="the inbound command")
        assert (msg.text, msg.chat_type, msg.group_id, msg.sender_id, msg.mentions_bot) == (
            "/verbose on", "channel", dc.channel_id, dc.bob.id, True)
        assert msg.message_id == f"interaction:{record.id}"
        # a turn's reply to the same channel is not the command's answer
        reply = await ch.send(OutboundMessage(channel="discord", to=dc.channel_id,
                                              text="an ordinary reply"))
        assert reply.ok and len(dc.sent_messages(dc.channel_id)) == 1
        # nor is a notice that answers nothing (or another command)
        other = await ch.send(OutboundMessage(channel="discord", to=dc.channel_id,
                                              text="(The gateway restarted.)", kind="notice",
                                              answers="interaction:1"))
        assert other.ok and len(dc.sent_messages(dc.channel_id)) == 2
        long = "\n\n".join(f"paragraph {i} " + "x" * 80 for i in range(40))  # > 2000
        answer = await ch.send(OutboundMessage(channel="discord", to=dc.channel_id,
                                               text=long, kind="notice",
                                               answers=msg.message_id))
        assert answer.ok and len(answer.message_ids) >= 2
        assert len(record.responses) == len(answer.message_ids)
        assert all(f["flags"] & 64 for f in record.followups)  # ephemeral follow-ups
        assert "".join(record.responses).count("paragraph") == 40
        assert len(dc.sent_messages(dc.channel_id)) == 2  # nothing more in the channel
        # nothing waits any more: the next notice goes to the channel
        await ch.send(OutboundMessage(channel="discord", to=dc.channel_id, text="later",
                                      kind="notice", answers=msg.message_id))
        assert len(dc.sent_messages(dc.channel_id)) == 3
    finally:
        await ch.stop()


async def test_unanswered_invocation_expires_on_the_clock(dc):
    from channels.discord.commands import TOKEN_TTL
    from runtime.clock import FakeClock
    clock = FakeClock()
    inbox: list = []
    ch = await adapter(dc, clock, inbox)
    try:
        await registered(dc, None)
        record = await dc.interactions.invoke("help", guild=False)
        await until(lambda: inbox, what="the inbound command")
        await until(lambda: record.callback is not None, what="the deferral")
        await clock.advance(TOKEN_TTL - 1)
        await asyncio.sleep(0.1)
        assert not record.deleted
        await clock.advance(2)
        await until(lambda: record.deleted, what="the placeholder removed")
    finally:
        await ch.stop()


async def test_refused_invocation_is_answered_at_once(tmp_path, model, dc):
    async with running_gateway(config(tmp_path, model, dc)):  # groups: #general only
        await registered(dc, None)
        refused = await dc.interactions.invoke("help", channel_id=dc.other_channel_id)
        assert await answered(refused) == "This command is not available here."
        assert refused.ephemeral and channel_posts(dc) == []


async def test_every_command_answers_ephemerally(tmp_path, model, dc):
    async with running_gateway(config(tmp_path, model, dc, allow_from=[dc.alice.id])):
        await registered(dc, None)
        answers = {}
        for name in NAMES:
            record = await dc.interactions.invoke(name)
            answers[name] = await answered(record)
            assert record.ephemeral, name
        assert all(a and "not available" not in a for a in answers.values()), answers
        assert channel_posts(dc) == [] and chat_requests(model) == []
        assert answers["new"] == "Started a new session." and answers["stop"] == \
            "Nothing is running."


async def test_failed_registration_is_logged_and_typed_commands_still_work(tmp_path, model,
                                                                           dc):
    from structlog.testing import capture_logs
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, dc, guild_ids=["4242"])) as gw:
            await until(lambda: any(e["event"] == "discord_commands_sync_failed"
                                    for e in logs), what="the sync failure")
            await dc.send_dm("/help")
            await until(lambda: channel_posts(dc), what="typed /help")
            assert gw.status()["channels"]["discord"]["state"] == "connected"
    [failed] = [e for e in logs if e["event"] == "discord_commands_sync_failed"]
    assert failed["guild_id"] == "4242" and "50001" in failed["error"]
    assert dc.interactions.registrations == []


async def test_pairing_code_is_ephemeral_and_a_repeat_is_answered(tmp_path, model, dc):
    async with running_gateway(config(tmp_path, model, dc, dm_policy="pairing")):
        await registered(dc, None)
        first = await dc.interactions.invoke("help", guild=False)
        assert "pairing code" in await answered(first)
        again = await dc.interactions.invoke("status", guild=False)
        assert await answered(again) == \
            "Your pairing request is waiting for the owner's approval."
        assert channel_posts(dc) == [] and chat_requests(model) == []
