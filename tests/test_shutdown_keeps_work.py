"""Shutdown loses nothing: a reply still being sent (e.g. waiting out a long 429) goes to
the outbox, and messages that were accepted but never ran stay in the intake journal and
run at the next start."""

import asyncio
import json

from channels.base import DeliveryResult, InboundMessage
from gateway.journal.store import FILE_NAME as JOURNAL_FILE
from gateway.journal.store import IntakeJournal
from runtime.clock import SYSTEM_CLOCK
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


def unfinished(state) -> list:
    """The intake journal's entries not done, as the next start would see them."""
    journal = IntakeJournal(state / JOURNAL_FILE, SYSTEM_CLOCK, fsync=False)
    try:
        return journal.load()
    finally:
        journal.close()


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
        assert [e.work["text"] for e in unfinished(state)] == ["second"]
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
        assert unfinished(state) == []


async def test_messages_kept_by_an_earlier_version_are_run_after_the_upgrade(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "pending-inbound.json").write_text(json.dumps([{
        "session_key": "agent:main:stuckchat:dm:u1",
        "work": {"agent_id": "main", "text": "from before the upgrade", "channel": "stuckchat",
                 "sender_id": "u1", "message_id": "m9", "run_id": "old1",
                 "route": {"channel": "stuckchat", "to": "u1", "account": "default",
                           "thread": None}}}]))
    async with FakeOpenAI() as fake:
        async with running_gateway(base_config(state, fake.base_url)):
            for _ in range(200):
                if fake.requests:
                    break
                await asyncio.sleep(0.02)
        assert [m["content"] for m in fake.requests[0].json["messages"]
                if m["role"] == "user"] == ["from before the upgrade"]
    assert not (state / "pending-inbound.json").exists()
