"""The WhatsApp adapter on its own against the fake Cloud API (tests/fakes/fake_whatsapp.py):
start-up states, status callbacks, read receipts, capped media downloads and the window
store. The gateway end of things is in tests/test_whatsapp.py."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from structlog.testing import capture_logs

from channels.base import OutboundMessage
from channels.media.model import MediaTooLarge
from channels.whatsapp.adapter import WhatsAppChannel
from channels.whatsapp.config import WhatsAppAccount
from channels.whatsapp.window import CustomerWindows
from runtime.clock import FakeClock
from runtime.storage.embedded.document_file import DocumentFile
from tests.channel_harness import log_events, until
from tests.fakes.fake_whatsapp import FakeWhatsApp

pytestmark = [pytest.mark.timeout(20)]
USER = "4915112345678"


@pytest.fixture
async def wa():
    fake = await FakeWhatsApp().start()
    yield fake
    await fake.stop()


def channel(wa: FakeWhatsApp, clock: Any = None, **over: Any) -> WhatsAppChannel:
    cfg = WhatsAppAccount.model_validate({
        "access_token": wa.token, "phone_number_id": wa.phone_number_id,
        "app_secret": "s", "verify_token": "v", "api_base_url": wa.url, **over})
    return WhatsAppChannel("default", cfg, clock=clock or FakeClock(time.time()))


async def started(ch: WhatsAppChannel) -> list[Any]:
    got: list[Any] = []

    async def on_message(msg: Any) -> str:
        got.append(msg)
        return "queued"

    async def on_event(event: Any) -> None:
        got.append(event)
    await ch.start(on_message, on_event)
    return got


async def test_a_rejected_token_fails_the_account_without_logging_it(wa):
    token = "EAAG-the-real-secret-token-123"
    with capture_logs() as logs:
        ch = channel(wa, access_token=token)
        await started(ch)
        result = await ch.send(OutboundMessage(channel="whatsapp", to=USER, text="hi"))
        assert ch.state == "failed"
        assert not ch.ready_for_webhook()  # webhooks get 503: Meta keeps them for later
        await ch.stop()
    assert ch.status()["last_error"].startswith("Graph API 401 code 190")
    assert not result.ok and not result.retryable
    assert log_events(logs, "whatsapp_token_rejected")
    assert token not in json.dumps(logs, default=str)


async def test_unreachable_at_start_then_connected_on_the_clock(wa):
    clock = FakeClock(time.time())
    wa.down = True
    ch = channel(wa, clock)
    await started(ch)
    assert ch.state == "reconnecting" and "503" in ch.status()["last_error"]
    wa.down = False
    await clock.advance(2)  # the first retry comes after 0.5-1 s
    await until(lambda: ch.state == "connected", what="connected")
    assert ch.status()["display_phone_number"] == "+1 555-010-0000"
    await ch.stop()


async def test_a_failed_status_131047_sends_the_template_once(wa):
    ch = channel(wa, window_template={"name": "reopen_chat", "language": "de"})
    await started(ch)
    ch.windows.opened(USER, time.time())
    error = {"code": 131047, "title": "Re-engagement message"}
    status = {"id": "wamid.A", "status": "failed", "recipient_id": USER, "errors": [error]}
    with capture_logs() as logs:
        await ch.dispatch(wa.payload(statuses=[status]))
        await ch.dispatch(wa.payload(statuses=[status]))  # Meta redelivers: handled once
        await until(lambda: wa.sent_to(USER, "template"), what="the template")
        await ch.dispatch(wa.payload(statuses=[{**status, "id": "wamid.B"}]))
        await until(lambda: log_events(logs, "whatsapp_window_refused"), what="refusal")
    await ch.stop()
    [tpl] = wa.sent_to(USER, "template")
    assert tpl["template"] == {"name": "reopen_chat", "language": {"code": "de"}}
    assert len(log_events(logs, "whatsapp_message_failed")) == 2
    [refused] = log_events(logs, "whatsapp_window_refused")
    assert "already sent" in refused["detail"]
    assert ch.status()["failed_deliveries"] == 2


async def test_read_receipts_and_the_typing_indicator(wa):
    clock = FakeClock(time.time())
    ch = channel(wa, clock, read_receipts=True)
    got = await started(ch)
    msg = {"from": USER, "id": "wamid.IN1", "timestamp": str(int(time.time())),
           "type": "text", "text": {"body": "hello"}}
    await ch.dispatch(wa.payload(messages=[msg]))
    assert [m.text for m in got] == ["hello"]
    await until(lambda: wa.calls("/messages"), what="the read receipt")
    await ch.typing(USER)
    await ch.typing(USER)  # within 20 s: not repeated
    await clock.advance(21)
    await ch.typing(USER)
    await ch.stop()
    bodies = [r["body"] for r in wa.calls("/messages")]
    assert bodies[0] == {"messaging_product": "whatsapp", "status": "read",
                         "message_id": "wamid.IN1"}
    assert [b.get("typing_indicator") for b in bodies[1:]] == [{"type": "text"}] * 2


async def test_a_file_over_the_cap_is_refused_before_its_download(wa):
    ch = channel(wa)
    await started(ch)
    wa.media["9001"] = {"data": b"y" * 5000, "mime": "application/pdf", "name": "a.pdf"}
    with pytest.raises(MediaTooLarge):
        await ch.media_fetch("9001", "a.pdf")(4096)
    assert not wa.calls("/download/9001")  # refused on the announced file_size
    assert await ch.media_fetch("9001", "a.pdf")(10_000) == b"y" * 5000
    await ch.stop()
    [download] = wa.calls("/download/9001")
    assert download["status"] == 200


def test_a_corrupt_window_file_is_kept_aside_and_reported(tmp_path):
    path = tmp_path / "whatsapp-default-windows.json"
    path.write_text("{not json")
    problems: list[str] = []
    windows = CustomerWindows(DocumentFile(path), FakeClock(), problems=problems)
    assert not windows.is_open(USER)
    assert list(tmp_path.glob("*.corrupt-*")) and "whatsapp windows" in problems[0]
    windows.opened(USER, FakeClock().time())
    assert windows.is_open(USER)
    assert json.loads(path.read_text())["last"] == {USER: FakeClock().time()}


async def test_channels_status_probe_checks_the_whatsapp_token(wa):
    import asyncio

    from gateway.cli.channels import probes
    from gateway.config.load import parse_config

    def loaded(token: str) -> Any:
        return parse_config({"channels": {"whatsapp": {
            "enabled": True, "access_token": token, "phone_number_id": wa.phone_number_id,
            "app_secret": "s", "verify_token": "v", "api_base_url": wa.url}}}, "test",
            env={})
    good = await asyncio.to_thread(probes, loaded(wa.token))
    bad = await asyncio.to_thread(probes, loaded("EAAG-revoked"))
    assert good == {"whatsapp": {"ok": True,
                                 "detail": "number +1 555-010-0000 (Tidegate Test)"}}
    assert bad == {"whatsapp": {"ok": False, "detail": "HTTP 401 (token rejected)"}}


def test_a_target_written_as_a_phone_number_is_the_users_wa_id():
    from channels.whatsapp.send import wa_id
    assert wa_id("+49 151 1234-5678") == wa_id("4915112345678") == "4915112345678"
    assert wa_id("(030) 1234.5678") == "03012345678"


async def test_reactions_in_once_and_out(wa):
    """A reaction is one ChannelEvent even when Meta redelivers it; the adapter reacts
    (and un-reacts) with the Cloud API's ``type: reaction`` message."""
    ch = channel(wa)
    got = await started(ch)
    wa.last_user_message[USER] = time.time()  # Meta's view: the user wrote earlier
    msg = {"from": USER, "id": "wamid.R1", "timestamp": str(int(time.time())),
           "type": "reaction", "reaction": {"message_id": "wamid.BOT", "emoji": "❤️"}}
    payload = wa.payload(messages=[msg], contacts=[{"profile": {"name": "Ana"},
                                                    "wa_id": USER}])
    await ch.dispatch(payload)
    await ch.dispatch(payload)
    await ch.react(USER, None, "wamid.IN", "👀")
    await ch.react(USER, None, "wamid.IN", "👀", remove=True)
    await ch.stop()
    [event] = got
    assert event.kind == "reaction" and event.peer_id == USER
    assert event.text == "WhatsApp reaction: Ana added ❤️ on message wamid.BOT"
    assert [m["reaction"] for m in wa.sent_to(USER, "reaction")] == [
        {"message_id": "wamid.IN", "emoji": "👀"}, {"message_id": "wamid.IN", "emoji": ""}]
    assert ch.windows.last_message(USER) is None  # a reaction does not open the window


def test_replicas_run_whatsapp_on_every_replica(wa):
    """Webhooks reach whichever replica the load balancer picks: the account is not
    leased to one replica (gateway/cluster/accounts.py)."""
    from gateway.cluster.accounts import _webhook
    assert _webhook(channel(wa))


async def test_a_refused_sender_leaves_no_window_no_receipt_and_no_memory(tmp_path, wa):
    """The access policy refuses strangers (outcome ``denied``): only the accepted user's
    24-hour window is written, only their message is marked read and remembered."""
    path = tmp_path / "whatsapp-default-windows.json"
    clock = FakeClock(time.time())
    cfg = WhatsAppAccount.model_validate({
        "access_token": wa.token, "phone_number_id": wa.phone_number_id, "app_secret": "s",
        "verify_token": "v", "api_base_url": wa.url, "read_receipts": True})
    ch = WhatsAppChannel("default", cfg, clock=clock, windows_document=DocumentFile(path))

    async def on_message(msg: Any) -> str:
        return "queued" if msg.sender_id == USER else "denied"

    async def on_event(event: Any) -> None:
        return None
    await ch.start(on_message, on_event)
    now = str(int(clock.time()))
    users = [USER, "4410000000001", "4410000000002"]
    outcomes = []
    for i, who in enumerate(users):
        outcomes += await ch.dispatch(wa.payload(messages=[{
            "from": who, "id": f"wamid.F{i}", "timestamp": now, "type": "text",
            "text": {"body": "hi"}}]))
    await until(lambda: wa.calls("/messages"), what="the read receipt")
    await clock.settle()
    await ch.stop()
    assert outcomes == ["queued", "denied", "denied"]
    assert list(json.loads(path.read_text())["last"]) == [USER]
    assert [r["body"]["message_id"] for r in wa.calls("/messages")] == ["wamid.F0"]
    assert ch.windows.is_open(USER) and not ch.windows.is_open(users[1])
    assert list(ch._inbound) == [USER]


def test_the_window_store_is_bounded_closed_windows_first():
    clock = FakeClock()
    now = clock.time()
    windows = CustomerWindows(None, clock, max_users=2)
    windows.opened("closed", now - 25 * 3600)
    windows.opened("older", now - 3600)
    windows.opened("newer", now)
    assert [w for w in ("closed", "older", "newer") if windows.last_message(w)] == [
        "older", "newer"]
    windows.opened("newest", now + 1)
    assert [w for w in ("older", "newer", "newest") if windows.last_message(w)] == [
        "newer", "newest"]
