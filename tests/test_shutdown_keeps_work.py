"""Shutdown loses nothing: a reply still being sent (e.g. waiting out a long 429) goes to
the outbox, and messages that were accepted but never ran are run at the next start."""

import asyncio
import json

from channels.base import DeliveryResult, InboundMessage
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway


class StuckChannel:
    """A channel whose send never finishes (a platform making us wait out a 429)."""

    name = "stuckchat"
    account_id = "default"
    state = "connected"

    async def send(self, msg) -> DeliveryResult:
        await asyncio.Event().wait()  # never finishes
        return DeliveryResult(ok=True)

    async def typing(self, to, thread_id=None) -> None:
        return None

    def status(self) -> dict:
        return {"state": self.state}


def inbound(text: str, mid: str) -> InboundMessage:
    return InboundMessage(channel="stuckchat", text=text, sender_id="u1", message_id=mid)


async def test_shutdown_keeps_the_stuck_reply_and_the_queued_message(tmp_path):
    async with FakeOpenAI() as fake:
        config = base_config(tmp_path / "state", fake.base_url,
                             gateway={"state_dir": str(tmp_path / "state"), "port": 0,
                                      "shutdown_grace": "300ms"})
        async with running_gateway(config) as gw:
            gw.deliverer.register(StuckChannel())
            fake.script_text("first answer")
            await gw.intake.on_message(inbound("first", "m1"))
            while not fake.requests:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # the reply is now stuck in delivery
            await gw.intake.on_message(inbound("second", "m2"))  # queued behind it
        state = tmp_path / "state"
        [entry] = [json.loads(p.read_text()) for p in (state / "outbox").glob("*.json")]
        assert entry["message"]["text"] == "first answer"
        pending = json.loads((state / "pending-inbound.json").read_text())
        assert [p["work"]["text"] for p in pending] == ["second"]
        assert len(fake.requests) == 1

        fake.script_text("second answer")
        async with running_gateway(config):
            for _ in range(200):
                if len(fake.requests) == 2:
                    break
                await asyncio.sleep(0.02)
        last_user = [m["content"] for m in fake.requests[-1].json["messages"]
                     if m["role"] == "user"][-1]
        assert last_user == "second"
        assert not (state / "pending-inbound.json").exists()
