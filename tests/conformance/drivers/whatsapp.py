"""WhatsApp on the fake Cloud API (tests/fakes/fake_whatsapp.py): webhooks into the
gateway, the Graph API (aiohttp) out. One-to-one chats only (no group test) and no
streaming, both documented on docs/channels/whatsapp.md."""

from __future__ import annotations

import re
from typing import Any

from tests.conformance.driver import ChannelDriver
from tests.fakes.fake_whatsapp import FakeWhatsApp

USER = "4915112345678"
SECRET, VERIFY = "conformance-app-secret", "conformance-verify"
_MARKS = re.compile(r"```|(?<!\w)[*_~](?=\S)|(?<=\S)[*_~](?!\w)")


class WhatsAppDriver(ChannelDriver):
    name = "whatsapp"
    limit = 4096
    dm_key = f"agent:main:whatsapp:dm:{USER}"
    streams = False
    groups = False

    async def start(self) -> None:
        self.fake = await FakeWhatsApp().start()

    async def stop(self) -> None:
        await self.fake.stop()

    def attach(self, gateway: Any) -> None:
        self.fake.set_webhook(f"http://127.0.0.1:{gateway.port}/whatsapp/webhook",
                              app_secret=SECRET, verify_token=VERIFY)

    def section(self, **overrides: Any) -> dict[str, Any]:
        return {"enabled": True, "access_token": self.fake.token,
                "phone_number_id": self.fake.phone_number_id, "app_secret": SECRET,
                "verify_token": VERIFY, "api_base_url": self.fake.url, "dm_policy": "open",
                "streaming": "off", **overrides}

    async def dm(self, text: str) -> Any:
        payload, _ = await self.fake.inject_text(USER, text)
        return payload

    async def dm_file(self, text: str, name: str, data: bytes, mime: str) -> Any:
        payload, _ = await self.fake.inject_media(USER, "document", data, mime,
                                                  caption=text, filename=name)
        return payload

    async def redeliver(self, handle: Any) -> None:
        await self.fake.redeliver(handle)

    def dm_texts(self) -> list[str]:
        return self.fake.texts(USER)

    def plain(self, text: str) -> str:
        return _MARKS.sub("", text)

    def dm_uploads(self) -> list[tuple[str, bytes]]:
        out = []
        for m in self.fake.sent_to(USER):
            kind = m.get("type")
            if kind in ("image", "audio", "document", "video"):
                media = self.fake.media[m[kind]["id"]]
                out.append((m[kind].get("filename") or media["name"], media["data"]))
        return out

    async def outage(self, down: bool) -> None:
        self.fake.down = down


DRIVER = WhatsAppDriver()
