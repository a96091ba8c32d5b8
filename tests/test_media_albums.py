"""Telegram albums (media groups) through the whole gateway (issue 12 "Media in"): every
part is journaled at intake like any message, so a kill -9 during ``media.album_wait``
loses nothing and the album is answered once after the restart; in a mention-gated group
the part with the @mention lets the album's other parts in, and an album that never
mentions the bot is not downloaded at all."""

from __future__ import annotations

import asyncio
import time

import pytest
import yaml

from tests.channel_harness import chat_requests, last_user_text, until
from tests.fakes import fake_telegram
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import GatewayProcess, base_config, running_gateway
from tests.media_files import image_parts, jpeg
from tests.test_intake_journal_crash import events
from tests.test_media_telegram import USER

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]
GROUP = -100777


def tg_config(state, model_url: str, tg_token: str, tg_url: str, album_wait: str) -> dict:
    section = {"enabled": True, "token": tg_token, "api_base_url": f"{tg_url}/bot",
               "poll_timeout": 1, "dm_policy": "open", "group_policy": "allowlist",
               "groups": [str(GROUP)]}
    cfg = base_config(state, model_url, channels={"telegram": section},
                      media={"album_wait": album_wait})
    cfg["models"]["providers"]["fake"]["models"] = {"fake-model": {"vision": True}}
    return cfg


def stop_all(gp: GatewayProcess, tg, model) -> None:
    """Nothing left running: the gateway (kill -9 if still up), the fakes."""
    if gp.proc is not None and gp.proc.poll() is None:
        gp.kill9()
    tg.stop()
    model.stop()


def answered_once(tg, chat: int, text: str) -> None:
    """Wait for the first answer in ``chat`` after a restart, then make sure it stays the
    only one (a second answer, or a Telegram redelivery, would show within 1.5 s)."""
    deadline = time.monotonic() + 30
    while not tg.call(tg.fake.bot_messages, chat):
        assert time.monotonic() < deadline, "the album was not answered after restart"
        time.sleep(0.1)
    time.sleep(1.5)
    assert [m["text"] for m in tg.call(tg.fake.bot_messages, chat)] == [text]


def held_and_confirmed(gp: GatewayProcess, tg) -> None:
    """Wait until a part is held for a mention and Telegram has its update confirmed."""
    deadline = time.monotonic() + 30
    while not events(gp, "inbound_album_held") or tg.call(lambda: len(tg.fake._pending)):
        assert time.monotonic() < deadline, "the part was not held and confirmed"
        time.sleep(0.05)


def shorter_wait(gp: GatewayProcess, cfg: dict) -> None:
    """Restart with ``media.album_wait`` 1 s: the parts that had not run wait again (for a
    part Telegram delivers only after the restart), not the 30 s that kept them waiting
    for the kill."""
    cfg["media"]["album_wait"] = "1s"
    gp.config_path.write_text(yaml.safe_dump(cfg))


def photos(n: int) -> list[bytes]:
    return [jpeg(320, 240, (40 * i, 200 - 40 * i, 90)) for i in range(n)]


def test_kill9_during_album_wait_loses_nothing_and_answers_once(tmp_path):
    model = FakeOpenAI.start_in_thread()
    tg = fake_telegram.start_in_thread()
    cfg = tg_config(tmp_path / "state", model.base_url, tg.fake.token, tg.url, "30s")
    gp = GatewayProcess(tmp_path, cfg).start()
    try:
        try:
            for i, data in enumerate(photos(3)):
                tg.call(tg.fake.inject_media, "photo", data, chat_id=USER, user_id=USER,
                        media_group_id="trip", caption="our trip" if i == 0 else None)
            deadline = time.monotonic() + 30
            # confirmed by the next getUpdates offset: Telegram will never resend them
            while tg.call(lambda: len(tg.fake._pending)):
                assert time.monotonic() < deadline, "the parts were not confirmed"
                time.sleep(0.1)
            assert len(events(gp, "inbound_album_part")) == 3
        finally:
            gp.kill9()
        assert chat_requests(model.server) == []  # still waiting for more parts
        assert tg.call(tg.fake.bot_messages, USER) == []

        model.server.script_text("Three photos of your trip.")
        shorter_wait(gp, cfg)
        gp.start()
        deadline = time.monotonic() + 30
        while not tg.call(tg.fake.bot_messages, USER):
            assert time.monotonic() < deadline, "the album was not answered after restart"
            time.sleep(0.1)
        time.sleep(1.5)  # a second answer (or a Telegram redelivery) would show by now
        assert [m["text"] for m in tg.call(tg.fake.bot_messages, USER)] == [
            "Three photos of your trip."]
        [req] = chat_requests(model.server)
        assert len(image_parts(req)) == 3 and last_user_text(req).startswith("our trip")
        [resumed] = events(gp, "journal_entry_resumed")
        assert resumed["action"] == "run" and len(resumed["album_parts"]) == 2
        assert gp.stop() == 0
    finally:
        stop_all(gp, tg, model)


async def test_mention_on_one_part_lets_the_album_in_and_unmentioned_albums_stay_out(
        tmp_path):
    tg = await FakeTelegram().start()
    try:
        async with FakeOpenAI() as model:
            model.script_text("Nice photos.")
            cfg = tg_config(tmp_path / "state", model.base_url, tg.token, tg.url, "0.3s")
            async with running_gateway(cfg):
                for i, data in enumerate(photos(3)):  # the caption (and mention) on part 2
                    tg.inject_media("photo", data, chat_id=GROUP, user_id=USER,
                                    media_group_id="g1",
                                    caption="@tidegate_test_bot what is this?" if i == 1
                                    else None)
                await until(lambda: tg.bot_messages(GROUP), what="the reply")
                downloads = len(tg.file_downloads)
                for data in photos(2):  # nobody asked the bot: not even downloaded
                    tg.inject_media("photo", data, chat_id=GROUP, user_id=USER,
                                    media_group_id="g2")
                polls = tg.calls.count("getUpdates")
                await until(lambda: tg.calls.count("getUpdates") >= polls + 2,
                            what="the parts polled")
                await asyncio.sleep(0.8)  # past album_wait: the album is dropped
            [req] = chat_requests(model)
            assert len(image_parts(req)) == 3
            assert "what is this?" in last_user_text(req)
            assert len(tg.bot_messages(GROUP)) == 1
            assert len(tg.file_downloads) == downloads == 3
    finally:
        await tg.stop()


def test_kill9_while_parts_wait_for_the_mentioning_part_loses_nothing(tmp_path):
    """In a mention-gated group the first part (no caption, no mention) waits for the
    part that mentions the bot. It is journaled while it waits, so a kill -9 then loses
    nothing: after the restart the mentioning part lets it in, it is fetched by its
    file_id, and the album is answered once with both photos."""
    model = FakeOpenAI.start_in_thread()
    tg = fake_telegram.start_in_thread()
    cfg = tg_config(tmp_path / "state", model.base_url, tg.fake.token, tg.url, "1s")
    gp = GatewayProcess(tmp_path, cfg).start()
    first, second = photos(2)
    try:
        try:
            tg.call(tg.fake.inject_media, "photo", first, chat_id=GROUP, user_id=USER,
                    media_group_id="harbour")
            held_and_confirmed(gp, tg)
            assert tg.call(lambda: len(tg.fake.file_downloads)) == 0  # held: not downloaded
        finally:
            gp.kill9()
        model.server.script_text("Two photos of the harbour.")
        tg.call(tg.fake.inject_media, "photo", second, chat_id=GROUP, user_id=USER,
                media_group_id="harbour", caption="@tidegate_test_bot which harbour?")
        gp.start()
        answered_once(tg, GROUP, "Two photos of the harbour.")
        [req] = chat_requests(model.server)
        assert len(image_parts(req)) == 2 and "which harbour?" in last_user_text(req)
        [held] = [e for e in events(gp, "journal_entry_resumed") if e["action"] == "held_again"]
        assert held["session_key"].endswith(str(GROUP))
        assert gp.stop() == 0
    finally:
        stop_all(gp, tg, model)


def test_kill9_while_a_let_in_part_downloads_merges_it_after_the_restart(tmp_path):
    """The mentioning part arrives and lets the held part in; the crash comes while the
    held part is still downloading. After the restart the held part (journaled) is
    fetched again and merged into the mentioning part's resumed turn: one answer, both
    photos; Telegram's redelivery of the unconfirmed mentioning part is a duplicate."""
    model = FakeOpenAI.start_in_thread()
    tg = fake_telegram.start_in_thread()
    cfg = tg_config(tmp_path / "state", model.base_url, tg.fake.token, tg.url, "30s")
    gp = GatewayProcess(tmp_path, cfg).start()
    first, second = photos(2)
    try:
        try:
            tg.call(tg.fake.inject_media, "photo", first, chat_id=GROUP, user_id=USER,
                    media_group_id="pier")
            held_path = tg.call(lambda: max(tg.fake.files.values(), key=lambda f: len(f[0]))[1])
            held_and_confirmed(gp, tg)
            tg.call(tg.fake.held_files.add, held_path)  # its download will hang
            deadline = time.monotonic() + 30
            tg.call(tg.fake.inject_media, "photo", second, chat_id=GROUP, user_id=USER,
                    media_group_id="pier", caption="@tidegate_test_bot which pier?")
            while held_path not in tg.call(lambda: list(tg.fake.file_downloads)):
                assert time.monotonic() < deadline, "the held part was not let in"
                time.sleep(0.05)
            assert len(events(gp, "inbound_album_part")) == 1  # the mentioning part
        finally:
            gp.kill9()
        tg.call(tg.fake.held_files.clear)
        model.server.script_text("Two photos of the pier.")
        shorter_wait(gp, cfg)
        gp.start()
        answered_once(tg, GROUP, "Two photos of the pier.")
        [req] = chat_requests(model.server)
        assert len(image_parts(req)) == 2 and "which pier?" in last_user_text(req)
        actions = [e["action"] for e in events(gp, "journal_entry_resumed")]
        assert "album_part" in actions and "run" in actions
        assert gp.stop() == 0
    finally:
        stop_all(gp, tg, model)


def test_kill9_between_parts_the_rest_delivered_after_restart_joins_the_album(tmp_path):
    """Two parts journaled, kill -9, the third part reaches Telegram only now: after the
    restart the journaled parts wait again and the late part joins them — one turn with
    all three photos, answered once (before, the two ran at once and the third alone)."""
    model = FakeOpenAI.start_in_thread()
    tg = fake_telegram.start_in_thread()
    cfg = tg_config(tmp_path / "state", model.base_url, tg.fake.token, tg.url, "3s")
    gp = GatewayProcess(tmp_path, cfg).start()
    try:
        data = photos(3)
        try:
            for i in range(2):
                tg.call(tg.fake.inject_media, "photo", data[i], chat_id=USER, user_id=USER,
                        media_group_id="trip", caption="our trip" if i == 0 else None)
            deadline = time.monotonic() + 30
            while tg.call(lambda: len(tg.fake._pending)) or len(
                    events(gp, "inbound_album_part")) < 2:
                assert time.monotonic() < deadline, "the parts were not confirmed"
                time.sleep(0.1)
        finally:
            gp.kill9()
        model.server.script_text("Three photos of your trip.")
        model.server.script_text("a second answer")
        gp.start()
        tg.call(tg.fake.inject_media, "photo", data[2], chat_id=USER, user_id=USER,
                media_group_id="trip")
        answered_once(tg, USER, "Three photos of your trip.")
        [req] = chat_requests(model.server)
        assert len(image_parts(req)) == 3 and last_user_text(req).startswith("our trip")
        assert gp.stop() == 0
    finally:
        stop_all(gp, tg, model)
