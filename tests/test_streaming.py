"""Streamed replies through the whole gateway (issue 13 "Streamed replies"): the real
adapters against the platform fakes, the fake model pacing its stream piece by piece
(``StreamGate``) and a FakeClock driving the edit throttle — nothing sleeps.

Proven here: a slow streamed reply produces several drafts/edits and one final message
equal to the non-streamed text; a reply longer than the limit continues in a second
message; a 429 during edits delays only that session; a failed turn's stream ends with a
failure notice; a streamed NO_REPLY / HEARTBEAT_OK leaves no message; block mode sends
each finished paragraph as its own message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from channels.outbound.render import render_chunks
from runtime.clock import FakeClock
from tests.channel_harness import chat_requests, long_reply, until
from tests.fakes.fake_discord import FakeDiscord
from tests.fakes.fake_openai import StreamGate
from tests.fakes.fake_slack import FakeSlack
from tests.fakes.fake_telegram import FakeTelegram, parse_html
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER, OTHER = 4242, 5151
GROUP, GROUP2 = -1001234567890, -1009876543210
ANSWER = ("Here is the **tide table** for today: high water at 06:12 and 18:40, "
          "low water at 12:25. Bring boots if you go out at noon.")


@contextlib.asynccontextmanager
async def gateway(cfg: dict, clock: FakeClock, *gates: StreamGate) -> AsyncIterator[Any]:
    """``running_gateway`` on ``clock``; at the end (also after a failed assertion) the
    gates open and the clock ticks so that running turns and the shutdown grace finish."""
    cm = running_gateway(cfg, clock=clock)
    gw = await cm.__aenter__()
    try:
        yield gw
    finally:
        for g in gates:
            g.open()

        async def tick() -> None:
            while True:
                await clock.advance(0.5)
                await asyncio.sleep(0.005)

        ticking = asyncio.create_task(tick())
        try:
            await cm.__aexit__(None, None, None)
        finally:
            ticking.cancel()


def tg_config(tmp_path, model, tg, **extra: Any) -> dict:
    section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
               "poll_timeout": 1, "dm_policy": "open", "group_policy": "allowlist",
               "groups": [str(GROUP), str(GROUP2)], "require_mention": False, **extra}
    return base_config(tmp_path / "state", model.base_url, channels={"telegram": section})


def calls(tg: FakeTelegram, method: str, chat: int | None = None) -> list[dict[str, Any]]:
    return [s["payload"] for s in tg.sent if s["method"] == method and s["status"] == 200
            and (chat is None or s["payload"].get("chat_id") == chat)]


async def stream_sleeping(clock: FakeClock) -> None:
    """Wait until the stream's flush task sleeps on the throttle (< typing's 4 s)."""
    await until(lambda: (d := clock.next_deadline()) is not None and d <= 1.0 + 1e-6,
                what="the stream waiting on its throttle")


def final_parts(text: str) -> list[str]:
    """What a non-streamed reply of ``text`` shows on Telegram (parsed text per part)."""
    return [parse_html(c.formatted) for c in render_chunks(text, "telegram")]


async def test_private_chat_drafts_then_one_final_message(tmp_path, model, tg):
    clock = FakeClock()
    gate = StreamGate()
    model.push({"type": "text", "text": ANSWER, "gate": gate})
    async with gateway(tg_config(tmp_path, model, tg), clock, gate):
        update = tg.inject_message("tides?", chat_id=USER, user_id=USER)
        gate.allow(1)
        await until(lambda: calls(tg, "sendMessageDraft"), what="the first draft")
        [first] = calls(tg, "sendMessageDraft")
        assert first["text"] == "Here"
        # more text arrives within the interval: nothing is sent until the clock moves
        gate.allow(4)
        await until(lambda: gate.sent == 5, what="four more pieces")
        await stream_sleeping(clock)
        assert len(calls(tg, "sendMessageDraft")) == 1
        await clock.advance(1.0)
        await until(lambda: len(calls(tg, "sendMessageDraft")) == 2, what="second draft")
        second = calls(tg, "sendMessageDraft")[-1]
        assert second["text"] == "Here is the <b>tide table</b>"  # coalesced, formatted
        assert second["draft_id"] == first["draft_id"]  # the same draft animates
        gate.allow(6)
        await until(lambda: gate.sent == 11, what="more pieces")
        await stream_sleeping(clock)
        await clock.advance(1.0)
        await until(lambda: len(calls(tg, "sendMessageDraft")) == 3, what="third draft")
        assert not calls(tg, "sendMessage")  # drafts only, until the reply is complete
        gate.open()
        await until(lambda: len(chat_requests(model)) == 1 and gate.sent > 20,
                    what="the whole answer")
        for _ in range(3):
            await clock.advance(1.0)
            if calls(tg, "sendMessage", USER):
                break
        [final] = await until(lambda: calls(tg, "sendMessage", USER), what="the final")
    assert final["text"] == render_chunks(ANSWER, "telegram")[0].formatted
    assert final["parse_mode"] == "HTML"
    assert final["reply_parameters"]["message_id"] == update["message"]["message_id"]
    assert tg.chat_view(USER) == final_parts(ANSWER)
    assert not calls(tg, "editMessageText")


async def test_group_grows_in_place_and_continues_past_the_limit(tmp_path, model, tg):
    clock = FakeClock()
    gate = StreamGate()
    text = long_reply()
    pieces = [text[i:i + 700] for i in range(0, len(text), 700)]
    model.push({"type": "text", "text": text, "pieces": pieces, "gate": gate})
    async with gateway(tg_config(tmp_path, model, tg, streaming="partial"), clock, gate):
        tg.inject_message("the script", chat_id=GROUP, user_id=USER)
        for n in range(1, len(pieces) + 1):
            gate.allow(1)
            await until(lambda n=n: gate.sent == n, what=f"piece {n}")
            await clock.advance(1.0)
        await until(lambda: len(chat_requests(model)) == 1, what="the model call")
        for _ in range(3):
            await clock.advance(1.0)
        await until(lambda: tg.chat_view(GROUP) == final_parts(text), what="final state")
    posts, edits = calls(tg, "sendMessage", GROUP), calls(tg, "editMessageText", GROUP)
    assert len(posts) == len(final_parts(text)) >= 3  # continued in further messages
    assert len(edits) >= 4  # the reply grew in place
    assert not calls(tg, "sendMessageDraft")  # drafts are for private chats only


async def test_429_on_an_edit_delays_only_that_session(tmp_path, model, tg):
    clock = FakeClock()
    gate_a, gate_b = StreamGate(), StreamGate()
    model.push({"type": "text", "text": ANSWER, "gate": gate_a})
    model.push({"type": "text", "text": ANSWER, "gate": gate_b})
    async with gateway(tg_config(tmp_path, model, tg, streaming="partial"), clock,
                       gate_a, gate_b):
        tg.inject_message("tides A", chat_id=GROUP, user_id=USER)
        gate_a.allow(1)
        await until(lambda: calls(tg, "sendMessage", GROUP), what="A's first message")
        tg.inject_message("tides B", chat_id=GROUP2, user_id=OTHER)
        gate_b.allow(1)
        await until(lambda: calls(tg, "sendMessage", GROUP2), what="B's first message")
        tg.rate_limit(count=1, retry_after=5, method="editMessageText")
        gate_a.allow(2)
        await until(lambda: gate_a.sent == 3, what="A's pieces")
        await clock.advance(1.0)  # A's edit: 429, retry after 5 s
        await until(lambda: any(s["method"] == "editMessageText" and s["status"] == 429
                                for s in tg.sent), what="A's rate-limited edit")
        gate_b.allow(2)
        await until(lambda: gate_b.sent == 3, what="B's pieces")
        await clock.advance(1.0)
        await until(lambda: calls(tg, "editMessageText", GROUP2), what="B's edit")
        assert not calls(tg, "editMessageText", GROUP)  # A waits out its 429 alone
        for _ in range(3):
            await clock.advance(1.0)
        assert not calls(tg, "editMessageText", GROUP)
        await clock.advance(1.5)
        await until(lambda: calls(tg, "editMessageText", GROUP), what="A's delayed edit")
        gate_a.open()
        gate_b.open()
        await until(lambda: len(chat_requests(model)) == 2 and gate_a.sent > 20
                    and gate_b.sent > 20, what="both answers")
        for _ in range(3):
            await clock.advance(1.0)
        for chat in (GROUP, GROUP2):
            await until(lambda c=chat: tg.chat_view(c) == final_parts(ANSWER),
                        what=f"final state of {chat}")


async def test_failed_turn_ends_with_a_notice(tmp_path, model, tg):
    clock = FakeClock()
    gate = StreamGate()
    model.push({"type": "cut", "text": "The first step is to open the", "gate": gate})
    async with gateway(tg_config(tmp_path, model, tg, streaming="partial"), clock, gate):
        tg.inject_message("how?", chat_id=GROUP, user_id=USER)
        gate.allow(3)
        await until(lambda: calls(tg, "sendMessage", GROUP), what="the streamed start")
        gate.open()
        for _ in range(4):
            await clock.advance(1.0)
        [shown] = await until(lambda: [v for v in tg.chat_view(GROUP) if "cut off" in v],
                              what="the failure notice")
    assert shown.startswith("The first step is to open the")
    assert shown.endswith("⚠️ The reply was cut off: the turn failed.")
    assert " …" in shown and len(tg.chat_view(GROUP)) == 1


@pytest.mark.parametrize("reply", ["Checking the list… nothing new here.\n\nNO_REPLY",
                                   "HEARTBEAT_OK", "**NO_REPLY**"])
async def test_streamed_silent_reply_leaves_no_message(tmp_path, model, tg, reply):
    clock = FakeClock()
    gate = StreamGate()
    model.push({"type": "text", "text": reply, "gate": gate})
    model.script_text("sentinel")
    async with gateway(tg_config(tmp_path, model, tg, streaming="partial"), clock, gate):
        tg.inject_message("anything?", chat_id=GROUP, user_id=USER)
        await until(lambda: len(chat_requests(model)) == 1, what="the model call")
        for n in range(1, 7):
            gate.allow(1)
            await until(lambda n=n: gate.sent >= min(n, len(reply.split())), what="piece")
            await clock.advance(1.0)
        gate.open()
        await until(lambda: len(chat_requests(model)) == 1, what="the model call")
        for _ in range(3):
            await clock.advance(1.0)
        tg.inject_message("next", chat_id=GROUP, user_id=USER)
        await until(lambda: len(chat_requests(model)) == 2, what="the sentinel turn")
        for _ in range(3):
            await clock.advance(1.0)
        await until(lambda: tg.chat_view(GROUP) == ["sentinel"], what="only the sentinel")
    shown = calls(tg, "sendMessage", GROUP)
    if reply.startswith("Checking"):  # shown while streaming, then deleted
        assert len(shown) == 2 and calls(tg, "deleteMessage", GROUP)
    else:  # a leading token is never shown at all
        assert [p["text"] for p in shown] == ["sentinel"]
        assert not calls(tg, "editMessageText") and not calls(tg, "deleteMessage")


async def test_discord_block_mode_sends_each_paragraph(tmp_path, model):
    clock = FakeClock()
    gate = StreamGate()
    paragraphs = ["First, check the tide table.", "Second, **bring boots**.",
                  "Third, enjoy the walk."]
    text = "\n\n".join(paragraphs)
    model.push({"type": "text", "text": text, "gate": gate,
                "pieces": ["First, check ", "the tide table.\n\n", "Second, **bring ",
                           "boots**.\n\n", "Third, enjoy ", "the walk."]})
    dc = FakeDiscord()
    await dc.start()
    try:
        section = {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
                   "gateway_url": dc.gateway_url, "group_policy": "allowlist",
                   "groups": [dc.channel_id]}
        async with gateway(base_config(tmp_path / "s", model.base_url,
                                       channels={"discord": section}), clock, gate):
            await dc.send_guild("the plan", mention=True)
            gate.allow(1)
            await until(lambda: gate.sent == 1, what="piece 1")
            await clock.advance(1.0)
            assert dc.chat_view(dc.channel_id) == []  # no finished block yet
            gate.allow(1)
            await until(lambda: dc.chat_view(dc.channel_id) == [paragraphs[0]],
                        what="the first block")
            gate.allow(2)
            await until(lambda: gate.sent == 4, what="pieces 3-4")
            await clock.advance(1.0)
            await until(lambda: len(dc.chat_view(dc.channel_id)) == 2, what="block 2")
            gate.open()
            await until(lambda: len(chat_requests(model)) == 1, what="the model call")
            for _ in range(3):
                await clock.advance(1.0)
            await until(lambda: dc.chat_view(dc.channel_id) == paragraphs,
                        what="three messages")
        assert not dc.edits()  # block mode posts, it does not edit
    finally:
        await dc.stop()


async def test_discord_and_slack_dms_grow_in_place(tmp_path, model):
    clock = FakeClock()
    gates = [StreamGate(), StreamGate()]
    for g in gates:
        model.push({"type": "text", "text": ANSWER, "gate": g})
    dc = FakeDiscord()
    await dc.start()
    async with FakeSlack() as slack:
        try:
            channels = {
                "discord": {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
                            "gateway_url": dc.gateway_url, "dm_policy": "open"},
                "slack": {"enabled": True, "bot_token": slack.bot_token,
                          "app_token": slack.app_token, "api_base_url": slack.api_url,
                          "dm_policy": "open"}}
            async with gateway(base_config(tmp_path / "s", model.base_url,
                                           channels=channels), clock, *gates):
                await dc.send_dm("tides?")
                gates[0].allow(1)
                dm = await until(lambda: dc.dm_channels.get(dc.alice.id), what="dm")
                await until(lambda: dc.chat_view(dm), what="discord first text")
                gates[0].open()
                await until(lambda: len(chat_requests(model)) == 1, what="discord turn")
                await slack.push_event(slack.dm("tides?"))
                gates[1].allow(1)
                await until(lambda: len(chat_requests(model)) == 2, what="slack turn")
                im = await until(lambda: slack.messages() and slack.messages()[0]
                                 and slack.sent[0]["channel"], what="slack first post")
                gates[1].open()
                for _ in range(5):
                    await clock.advance(1.0)
                await until(lambda: dc.chat_view(dm) == [render_chunks(
                    ANSWER, "discord")[0].formatted], what="discord final")
                await until(lambda: slack.chat_view(im) == [render_chunks(
                    ANSWER, "slack")[0].formatted], what="slack final")
            assert dc.edits(dm) and slack.updates(im)
            assert len(dc.sent_messages(dm)) == 1 and len(slack.messages(im)) == 1
        finally:
            await dc.stop()


@pytest.mark.parametrize("mode", ["partial", "block"])
async def test_stop_mid_stream_ends_with_a_stopped_notice(tmp_path, model, tg, mode):
    clock = FakeClock()
    gate = StreamGate()
    model.push({"type": "text", "gate": gate,
                "text": "First paragraph is done.\n\nSecond paragraph keeps going and going"})
    async with gateway(tg_config(tmp_path, model, tg, streaming=mode), clock, gate):
        tg.inject_message("how?", chat_id=GROUP, user_id=USER)
        gate.allow(6)
        await until(lambda: gate.sent >= 6, what="six pieces")
        for _ in range(2):
            await clock.advance(1.0)
        await until(lambda: calls(tg, "sendMessage", GROUP), what="the streamed start")
        tg.inject_message("/stop", chat_id=GROUP, user_id=USER)
        for _ in range(8):
            await clock.advance(1.0)
            await asyncio.sleep(0.02)
        [stopped] = await until(lambda: [v for v in tg.chat_view(GROUP) if "⏹" in v],
                                what="the stopped notice")
    assert stopped.endswith("…\n\n⏹ Stopped.")
    assert "Stopped." in tg.chat_view(GROUP)  # the /stop answer
    if mode == "partial":
        assert stopped.startswith("First paragraph is done.\n\nSecond paragraph")
    else:  # the finished block stays; the unfinished one is cut off
        assert tg.chat_view(GROUP)[0] == "First paragraph is done."
        assert stopped.startswith("Second paragraph")


# (a 403/400 refusal is for good - the bot was removed, the chat is gone - and ends the
# message as failed instead: tests/test_delivery_once.py, permanent refusal)
@pytest.mark.parametrize("status", [500])
async def test_refused_first_post_goes_to_the_outbox_and_arrives_once(tmp_path, model, tg,
                                                                     status):
    clock = FakeClock()
    gate = StreamGate()
    model.push({"type": "text", "text": ANSWER, "gate": gate})
    async with gateway(tg_config(tmp_path, model, tg, streaming="partial"), clock, gate):
        tg.fail("sendMessage", status=status)
        tg.inject_message("tides?", chat_id=GROUP, user_id=USER)
        gate.allow(3)
        await until(lambda: any(s["method"] == "sendMessage" for s in tg.sent),
                    what="the refused first post")
        gate.open()
        await until(lambda: len(chat_requests(model)) == 1, what="the model call")

        async def delivered() -> list[str]:
            for _ in range(60):  # the outbox retries on the clock
                if tg.chat_view(GROUP):
                    break
                await clock.advance(1.0)
                await asyncio.sleep(0.02)
            return tg.chat_view(GROUP)
        assert await delivered() == final_parts(ANSWER)
    assert len(calls(tg, "sendMessage", GROUP)) == 1  # the outbox's one send


@pytest.mark.parametrize("status,description", [
    (404, "Not Found"), (400, "Bad Request: method not found")])
async def test_a_server_without_drafts_falls_back_to_send_and_edit(tmp_path, model, tg,
                                                                    status, description):
    """A Bot API server that does not know sendMessageDraft: the reply still grows live
    (sendMessage + editMessageText), the draft is not tried again, and one warning says so."""
    clock = FakeClock()
    gates = [StreamGate(), StreamGate()]
    for g in gates:
        model.push({"type": "text", "text": ANSWER, "gate": g})
    tg.fail("sendMessageDraft", status=status, count=100, description=description)
    with capture_logs() as logs:
        async with gateway(tg_config(tmp_path, model, tg), clock, *gates):
            for n, gate in enumerate(gates, start=1):
                tg.inject_message(f"tides {n}?", chat_id=USER, user_id=USER)
                gate.allow(1)
                await until(lambda n=n: len(calls(tg, "sendMessage", USER)) == n,
                            what=f"reply {n} posted while streaming")
                gate.open()
                await until(lambda n=n: len(chat_requests(model)) == n, what=f"turn {n}")
                for _ in range(3):
                    await clock.advance(1.0)
                await until(lambda n=n: len(calls(tg, "editMessageText", USER)) >= n,
                            what=f"reply {n} grown in place")
    tried = [s for s in tg.sent if s["method"] == "sendMessageDraft"]
    assert len(tried) == 1  # refused once, never tried again for this bot
    assert tg.chat_view(USER) == final_parts(ANSWER) * 2
    assert [e["event"] for e in logs].count("telegram_drafts_unavailable") == 1


@pytest.mark.parametrize("chat", [USER, GROUP])
async def test_a_retried_stream_starts_again_from_empty(tmp_path, model, tg, chat):
    """Both attempts of a model call are cut partway (a timeout, a dropped stream): the
    reply shows only the last attempt's text and the notice, never both attempts."""
    clock = FakeClock()
    gate1, gate2 = StreamGate(), StreamGate()
    model.push({"type": "cut", "text": "Alpha beta gamma delta", "gate": gate1})
    model.push({"type": "cut", "text": "Omega psi chi", "gate": gate2})
    cfg = tg_config(tmp_path, model, tg, streaming="partial")
    cfg["models"].update(retries=1, retry_backoff=0.1)
    async with gateway(cfg, clock, gate1, gate2):
        tg.inject_message("how?", chat_id=chat, user_id=USER)
        gate1.allow(3)
        await until(lambda: gate1.sent == 3, what="attempt 1's start")
        await clock.advance(1.0)
        gate1.open()
        await until(lambda: len(chat_requests(model)) >= 1, what="attempt 1")
        for _ in range(40):  # the retry's backoff, then attempt 2
            if len(chat_requests(model)) == 2:
                break
            await clock.advance(0.5)
            await asyncio.sleep(0.01)
        await until(lambda: len(chat_requests(model)) == 2, what="attempt 2")
        gate2.open()
        for _ in range(40):  # the throttle before the final form (the clock)
            if any("cut off" in v for v in tg.chat_view(chat)):
                break
            await clock.advance(1.0)
            await asyncio.sleep(0.02)
        [shown] = await until(lambda: [v for v in tg.chat_view(chat) if "cut off" in v],
                              what="the failure notice")
    assert shown.startswith("Omega psi chi")
    assert "Alpha" not in shown
    assert shown.endswith("⚠️ The reply was cut off: the turn failed.")
    assert len(tg.chat_view(chat)) == 1


async def test_a_retried_block_stream_removes_the_failed_attempts_blocks(tmp_path, model,
                                                                          tg):
    clock = FakeClock()
    gate1, gate2 = StreamGate(), StreamGate()
    model.push({"type": "cut", "text": "", "gate": gate1,
                "pieces": ["Old first block.\n\n", "Old second"]})
    model.push({"type": "text", "text": "", "gate": gate2,
                "pieces": ["New first block.\n\n", "New second block."]})
    cfg = tg_config(tmp_path, model, tg, streaming="block")
    cfg["models"].update(retries=1, retry_backoff=0.1)
    async with gateway(cfg, clock, gate1, gate2):
        tg.inject_message("plan?", chat_id=GROUP, user_id=USER)
        gate1.allow(1)
        await until(lambda: tg.chat_view(GROUP) == ["Old first block."],
                    what="attempt 1's first block")
        gate1.open()
        for _ in range(40):  # the retry's backoff, then attempt 2
            if len(chat_requests(model)) == 2:
                break
            await clock.advance(0.5)
            await asyncio.sleep(0.01)
        gate2.open()
        want = "New first block.\n\nNew second block."  # blocks may be coalesced
        for _ in range(40):  # the throttle between posts (the clock)
            if "\n\n".join(tg.chat_view(GROUP)) == want:
                break
            await clock.advance(1.0)
            await asyncio.sleep(0.02)
        await until(lambda: "\n\n".join(tg.chat_view(GROUP)) == want,
                    what="only the retry's blocks")
    assert calls(tg, "deleteMessage", GROUP)
