"""Slack on the fake Web API + Socket Mode (tests/fakes/fake_slack/), slack-bolt."""

from __future__ import annotations

import html
from typing import Any

from tests.conformance.driver import ChannelDriver
from tests.fakes.fake_slack import FakeSlack

ALICE, IM, CHANNEL = "U0ALICE", "D0ALICE", "C0GENERAL"


class SlackDriver(ChannelDriver):
    name = "slack"
    limit = 4000
    dm_key = "agent:main:slack:dm:u0alice"
    group_key = "agent:main:slack:group:c0general"
    streams = True

    async def start(self) -> None:
        self.fake = await FakeSlack().start()

    async def stop(self) -> None:
        await self.fake.stop()

    def section(self, **overrides: Any) -> dict[str, Any]:
        return {"enabled": True, "bot_token": self.fake.bot_token,
                "app_token": self.fake.app_token, "api_base_url": self.fake.api_url,
                "dm_policy": "open", "groups": [CHANNEL], "streaming": "off",
                "reply_in_thread": False, **overrides}

    async def dm(self, text: str) -> Any:
        return await self.fake.push_event(self.fake.dm(text))

    async def group(self, text: str, *, mention: bool) -> Any:
        body = self.fake.mention_text(text) if mention else text
        return await self.fake.push_event(self.fake.message(body))

    async def dm_file(self, text: str, name: str, data: bytes, mime: str) -> Any:
        f = self.fake.add_file(name, data, mime)
        return await self.fake.push_event(self.fake.dm(text, subtype="file_share", files=[f]))

    async def redeliver(self, handle: Any) -> None:
        await self.fake.redeliver(handle)

    def dm_texts(self) -> list[str]:
        return self.fake.chat_view(IM)

    def group_texts(self) -> list[str]:
        return self.fake.chat_view(CHANNEL)

    def plain(self, text: str) -> str:
        return html.unescape(text)

    def dm_uploads(self) -> list[tuple[str, bytes]]:
        return [(u["filename"], u["data"]) for u in self.fake.uploads if u["channel"] == IM]

    def edit_count(self) -> int:
        return sum(1 for c in self.fake.calls if c["method"] in (
            "chat.update", "chat.appendStream", "chat.stopStream") and c["status"] == 200)

    async def outage(self, down: bool) -> None:
        await self.fake.set_outage(down, "5xx") if down else await self.fake.set_outage(False)


DRIVER = SlackDriver()
