"""A Discord account taken over by another replica resumes where the previous owner
stopped (issue 15 "Channel accounts"): the catch-up cursors (last acknowledged message
per channel) live in PostgreSQL, so the new owner — another adapter with its own
PostgreSQL connection, no files in common — fetches what was sent while nobody was
connected, and nothing the old owner had already handed on. The real discord.py client
against the fake Discord gateway + REST server, a real PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from channels.discord.adapter import DiscordChannel
from channels.discord.config import DiscordAccount
from runtime.clock import FakeClock
from runtime.storage.config import StorageSection
from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import open_database
from runtime.storage.postgres.stores import open_records
from tests.cluster_harness import until
from tests.fakes.fake_discord import FakeDiscord

pytestmark = pytest.mark.timeout(60)


class Replica:
    def __init__(self, fake: FakeDiscord, dsn: str, tmp) -> None:
        self.fake, self.dsn, self.tmp = fake, dsn, tmp
        self.texts: list[str] = []

    async def start(self) -> None:
        self.bridge = await asyncio.to_thread(SyncBridge, self.dsn)
        self.cursors = open_records("discord_cursors", self.bridge, account="default")
        cfg = DiscordAccount(token=self.fake.token, api_base_url=self.fake.api_url,
                             gateway_url=self.fake.gateway_url, message_content_intent=True,
                             send_timeout=10)
        self.ch = DiscordChannel("default", cfg, clock=FakeClock(), guild_ready_timeout=0.05,
                                 start_timeout=10, cursor_path=self.tmp / "cursors.json",
                                 cursor_records=self.cursors)

        async def on_message(m):
            self.texts.append(m.text)

        async def on_event(e):
            return None

        await self.ch.start(on_message, on_event)

    async def stop(self) -> None:
        await self.ch.stop()
        await asyncio.to_thread(self.bridge.close)


async def test_the_new_owner_catches_up_from_the_old_owners_cursor(pg_dsn, tmp_path):
    pool = await open_database(StorageSection(backend="postgres", dsn=pg_dsn))  # migrated
    fake = FakeDiscord()
    await fake.start()
    try:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        a = Replica(fake, pg_dsn, tmp_path / "a")
        await a.start()
        await fake.send_dm("one")
        await until(lambda: a.texts == ["one"], "replica a gets the first message")
        await asyncio.to_thread(a.cursors.wait_written)
        await a.stop()  # the owner is gone (its lease lapses)
        await fake.send_dm("two while nobody is connected")
        await fake.send_dm("three")
        b = Replica(fake, pg_dsn, tmp_path / "b")  # another replica, another state dir
        await b.start()
        await until(lambda: len(b.texts) == 2, "replica b catches up")
        assert b.texts == ["two while nobody is connected", "three"]  # not "one" again
        await fake.send_dm("four")
        await until(lambda: b.texts[-1:] == ["four"], "live messages after the catch-up")
        await b.stop()
        assert not (tmp_path / "a" / "cursors.json").exists()  # PostgreSQL held them
        assert not (tmp_path / "b" / "cursors.json").exists()
    finally:
        await fake.stop()
        await pool.close()
