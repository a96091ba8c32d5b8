"""Telegram on the fake Bot API (tests/fakes/fake_telegram.py), python-telegram-bot."""

from __future__ import annotations

from typing import Any

from tests.conformance.driver import ChannelDriver
from tests.fakes.fake_telegram import FakeTelegram, utf16_len

USER, GROUP = 4242, -1001234567890


class TelegramDriver(ChannelDriver):
    name = "telegram"
    limit = 4096
    dm_key = f"agent:main:telegram:dm:{USER}"
    group_key = f"agent:main:telegram:group:{GROUP}"
    streams = True

    async def start(self) -> None:
        self.fake = await FakeTelegram().start()

    async def stop(self) -> None:
        await self.fake.stop()

    def section(self, **overrides: Any) -> dict[str, Any]:
        return {"enabled": True, "token": self.fake.token,
                "api_base_url": f"{self.fake.url}/bot", "poll_timeout": 1,
                "dm_policy": "open", "groups": [str(GROUP)], "streaming": "off",
                **overrides}

    async def dm(self, text: str) -> Any:
        return self.fake.inject_message(text, chat_id=USER, user_id=USER)

    async def group(self, text: str, *, mention: bool) -> Any:
        prefix = f"@{self.fake.bot_user['username']} " if mention else ""
        return self.fake.inject_message(prefix + text, chat_id=GROUP, user_id=USER)

    async def dm_file(self, text: str, name: str, data: bytes, mime: str) -> Any:
        return self.fake.inject_media("document", data, chat_id=USER, user_id=USER,
                                      caption=text, file_name=name, mime_type=mime)

    async def redeliver(self, handle: Any) -> None:
        self.fake.redeliver(handle)

    def _view(self, chat: int) -> list[str]:
        bot = self.fake.bot_user["id"]
        return [m["text"] for (c, _mid), m in sorted(self.fake.messages.items(),
                                                      key=lambda kv: kv[0][1])
                if c == chat and (m.get("from") or {}).get("id") == bot and "text" in m]

    def dm_texts(self) -> list[str]:
        return self._view(USER)

    def group_texts(self) -> list[str]:
        return self._view(GROUP)

    def length(self, text: str) -> int:
        return utf16_len(text)  # the fake stores the parsed text, as Telegram counts it

    def dm_uploads(self) -> list[tuple[str, bytes]]:
        return [(u["filename"], u["data"]) for u in self.fake.uploads()
                if str(u["chat_id"]) == str(USER)]

    def edit_count(self) -> int:
        return sum(1 for s in self.fake.sent if s["status"] == 200 and s["method"].lower()
                   in ("editmessagetext", "sendmessagedraft"))

    async def outage(self, down: bool) -> None:
        if down:
            await self.fake.outage("5xx")
        else:
            await self.fake.recover()


DRIVER = TelegramDriver()
