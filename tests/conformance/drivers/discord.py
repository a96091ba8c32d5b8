"""Discord on the fake REST API + gateway WebSocket (tests/fakes/fake_discord/), discord.py."""

from __future__ import annotations

from typing import Any

from tests.conformance.driver import ChannelDriver
from tests.fakes.fake_discord import FakeDiscord
from tests.fakes.fake_telegram import utf16_len


class DiscordDriver(ChannelDriver):
    name = "discord"
    limit = 2000
    streams = True

    async def start(self) -> None:
        self.fake = FakeDiscord()
        await self.fake.start()
        self.dm_key = f"agent:main:discord:dm:{self.fake.alice.id}"
        self.group_key = f"agent:main:discord:group:{self.fake.channel_id}"

    async def stop(self) -> None:
        await self.fake.stop()

    def section(self, **overrides: Any) -> dict[str, Any]:
        return {"enabled": True, "token": self.fake.token, "api_base_url": self.fake.api_url,
                "gateway_url": self.fake.gateway_url, "dm_policy": "open",
                "groups": [self.fake.channel_id], "streaming": "off", **overrides}

    async def dm(self, text: str) -> Any:
        return await self.fake.send_dm(text)

    async def group(self, text: str, *, mention: bool) -> Any:
        return await self.fake.send_guild(text, mention=mention)

    async def dm_file(self, text: str, name: str, data: bytes, mime: str) -> Any:
        return await self.fake.send_dm_files(text, [(name, data, mime)])

    async def redeliver(self, handle: Any) -> None:
        await self.fake.dispatch("MESSAGE_CREATE", handle)

    def _dm_channel(self) -> str:
        return self.fake.dm_channel_for(self.fake.alice)

    def dm_texts(self) -> list[str]:
        return self.fake.chat_view(self._dm_channel())

    def group_texts(self) -> list[str]:
        return self.fake.chat_view(self.fake.channel_id)

    def length(self, text: str) -> int:
        return utf16_len(text)

    def dm_uploads(self) -> list[tuple[str, bytes]]:
        return [(f["filename"], f["data"]) for u in self.fake.uploads
                if u["channel_id"] == self._dm_channel() for f in u["files"]]

    def edit_count(self) -> int:
        return len(self.fake.edits())

    async def outage(self, down: bool) -> None:
        await self.fake.set_outage(down)


DRIVER = DiscordDriver()
