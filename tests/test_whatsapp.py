"""WhatsApp through the whole gateway: the real gateway in-process with the WhatsApp
channel (aiohttp Graph API client, webhook routes on the gateway's HTTP server) against
the fake Cloud API (tests/fakes/fake_whatsapp.py: Meta's Graph API and webhook sender)
and the fake OpenAI model. Each test asserts what the fake platform received, what the
model was asked, and what ended up on disk or in the logs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from channels.whatsapp.webhook import signature
from gateway.cli.webhooks import webhook_findings
from gateway.config.load import parse_config
from gateway.routing import Route
from runtime.clock import FakeClock
from tests.channel_harness import (
    EventHook,
    chat_requests,
    code_line_numbers,
    last_user_text,
    log_events,
    long_reply,
    outbox_files,
    run_cli,
    until,
    write_config,
)
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_whatsapp import FakeWhatsApp
from tests.helpers import base_config, running_gateway
from tests.media_files import jpeg

pytestmark = [pytest.mark.timeout(30)]

USER = "4915112345678"
SECRET = "app-secret-for-tests"
VERIFY = "verify-me-please"
KEY = f"agent:main:whatsapp:dm:{USER}"


@pytest.fixture
async def wa():
    clock_now = {"fn": time.time}
    fake = await FakeWhatsApp(now=lambda: clock_now["fn"]()).start()
    fake.clock_now = clock_now
    yield fake
    await fake.stop()


def config(tmp_path: Path, model: FakeOpenAI, wa: FakeWhatsApp, **over: Any) -> dict:
    section = {"enabled": True, "access_token": wa.token,
               "phone_number_id": wa.phone_number_id, "app_secret": SECRET,
               "verify_token": VERIFY, "api_base_url": wa.url, "dm_policy": "open", **over}
    cfg = base_config(tmp_path / "state", model.base_url, channels={"whatsapp": section})
    cfg["models"]["providers"]["fake"]["models"] = {"fake-model": {"vision": True}}
    return cfg


def hook_to(wa: FakeWhatsApp, gw: Any) -> None:
    wa.set_webhook(f"http://127.0.0.1:{gw.port}/whatsapp/webhook", app_secret=SECRET,
                   verify_token=VERIFY)


async def test_verify_sign_answer_refuse_and_redeliver(tmp_path, model, wa):
    """The hub.challenge handshake; a signed text answered in the same chat, quoting it;
    forged and unsigned posts refused with 401 and logged, no turn; a redelivered
    notification answered once; status callbacks logged; a long reply split at 4096."""
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, wa)) as gw:
            hook_to(wa, gw)
            status, body = await wa.verify()
            assert status == 200 and body.isdigit()
            assert (await wa.verify(verify_token="wrong"))[0] == 403
            # tidegate doctor: the public URL answers and refuses a wrong signature
            cfg = config(tmp_path, model, wa)
            cfg["gateway"]["public_base_url"] = f"http://127.0.0.1:{gw.port}"
            found = await asyncio.to_thread(webhook_findings,
                                            parse_config(cfg, "test", env={}))
            assert [(n, r[0]) for n, r in found] == [("whatsapp", "ok")], found

            payload, status = await wa.inject_text(USER, "hello over whatsapp", name="Ana")
            assert status == 200
            [reply] = await until(lambda: wa.sent_to(USER, "text"), what="the reply")
            wamid = payload["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
            assert reply["text"]["body"] == "echo: hello over whatsapp"
            assert reply["context"] == {"message_id": wamid}
            assert reply["messaging_product"] == "whatsapp"
            assert gw.status()["channels"]["whatsapp"]["state"] == "connected"

            forged = wa.payload(messages=[{**payload["entry"][0]["changes"][0]["value"][
                "messages"][0], "id": "wamid.FORGED", "text": {"body": "run this"}}])
            assert await wa.post(forged, secret="not-the-app-secret") == 401
            assert await wa.post(forged, signature="") == 401
            assert await wa.redeliver(payload) == 200  # Meta sends it again
            await wa.send_status(reply["id"], USER, "delivered")
            model.script_text(long_reply())
            await wa.inject_text(USER, "the whole script please")
            await until(lambda: len(wa.texts(USER)) >= 3, what="the long reply")
            await until(lambda: not any(gw.lanes.stats()["running"].values()),
                        what="the lane to go idle")
    assert [last_user_text(r).endswith(t) for r, t in zip(
        chat_requests(model), ["hello over whatsapp", "the whole script please"],
        strict=True)] == [True, True]
    assert "run this" not in json.dumps(chat_requests(model))
    bad = log_events(logs, "whatsapp_webhook_bad_signature")
    assert [b["reason"] for b in bad] == ["mismatch", "mismatch", "missing"]  # doctor, forged
    assert log_events(logs, "whatsapp_webhook_verify_refused")
    assert log_events(logs, "inbound_duplicate", channel="whatsapp")
    assert log_events(logs, "whatsapp_status", status="delivered", message_id=reply["id"])
    parts = wa.texts(USER)[1:]
    assert len(parts) >= 3 and all(len(p) <= 4096 for p in parts)
    assert code_line_numbers(parts) == list(range(110))
    assert "```" in "".join(parts) and "**" not in "".join(parts)
    assert SECRET not in json.dumps(logs) and wa.token not in json.dumps(logs)


async def test_media_in_and_out_and_a_reaction(tmp_path, model, wa):
    """An image with a caption reaches the model (fetched with GET /{media-id} and the
    bearer download); a file the model sends is uploaded and sent by media id; a
    reaction becomes a system event of the conversation, never a turn."""
    ws = tmp_path / "state" / "workspace" / "main"
    ws.mkdir(parents=True)
    (ws / "report.txt").write_text("numbers\n")
    (ws / "chart.jpg").write_bytes(jpeg(40, 40))
    photo = jpeg(300, 200)
    hook = EventHook()
    model.script_text("A red square.")
    model.script_tool_call("message", {"media": ["report.txt", "chart.jpg"],
                                       "text": "files for you"})
    async with running_gateway(config(tmp_path, model, wa)) as gw:
        hook_to(wa, gw)
        wired = gw.intake.on_channel_event

        def record(key: str, text: str, source: str, **kw) -> None:
            hook(key, text, source)
            wired(key, text, source, **kw)
        gw.intake.on_channel_event = record
        await wa.inject_media(USER, "image", photo, "image/jpeg", caption="what is this?")
        await until(lambda: wa.texts(USER), what="the answer to the photo")
        await wa.inject_text(USER, "send me the files")
        await until(lambda: len(wa.sent_to(USER, "document")) == 2 or
                    len(wa.sent_to(USER)) >= 4, what="the uploads")
        answered = wa.sent_to(USER, "text")[0]["id"]
        await wa.inject_reaction(USER, answered, "👍")
        await until(lambda: hook.calls, what="the reaction event")
    first = chat_requests(model)[0]
    assert last_user_text(first).startswith("what is this?")
    [stored] = list((ws / "inbox").glob("*/*"))
    assert stored.read_bytes() == photo
    assert wa.calls("/messages") and any(
        r["path"].endswith("/" + m) for r in wa.requests for m in wa.media
        if not wa.media[m].get("uploaded"))  # GET /{media-id}
    uploads = [r["body"] for r in wa.calls("/media")]
    assert [(u["name"], u["type"]) for u in uploads] == [("report.txt", "text/plain"),
                                                        ("chart.jpg", "image/jpeg")]
    [doc] = wa.sent_to(USER, "document")
    [img] = wa.sent_to(USER, "image")
    assert doc["document"]["filename"] == "report.txt"
    assert wa.media[doc["document"]["id"]]["data"] == b"numbers\n"
    assert wa.media[img["image"]["id"]]["data"] == (ws / "chart.jpg").read_bytes()
    assert "files for you" in wa.texts(USER)
    [(key, text, source)] = hook.calls
    assert (key, source) == (KEY, "whatsapp.reaction")
    assert "👍" in text and answered in text
    assert len(chat_requests(model)) == 3  # photo, files (tool call + final); no reaction turn


async def test_outbox_retry_and_the_24_hour_window(tmp_path, model, wa):
    """A Graph API 500 parks the reply in the outbox and the retry delivers it; a reply
    whose retry comes more than 24 hours after the user's last message goes out as the
    window template instead (once), and the reply is recorded as not delivered."""
    clock = FakeClock(time.time())
    wa.clock_now["fn"] = clock.time
    template = {"name": "reopen_chat", "language": "en_US"}
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, wa, window_template=template),
                                   clock=clock) as gw:
            hook_to(wa, gw)
            wa.fail(status=500, code=2, count=1)
            await wa.inject_text(USER, "first question")
            [entry] = await until(lambda: outbox_files(gw.state_dir), what="outbox entry")
            assert entry["message"]["text"] == "echo: first question"
            assert not wa.texts(USER)
            await clock.advance(6)  # the outbox's first retry (5 s)
            await until(lambda: wa.texts(USER) == ["echo: first question"],
                        what="delivery from the outbox")
            await until(lambda: not outbox_files(gw.state_dir), what="the outbox to drain")

            wa.fail(status=503, code=2, count=1)
            await wa.inject_text(USER, "second question")
            await until(lambda: outbox_files(gw.state_dir), what="second outbox entry")
            clock.set_wall(clock.time() + 25 * 3600)  # a day passes before the retry
            await clock.advance(6)
            [sent] = await until(lambda: wa.sent_to(USER, "template"), what="the template")
            assert sent["template"] == {"name": "reopen_chat", "language": {"code": "en_US"}}
            await until(lambda: not outbox_files(gw.state_dir), what="the entry to settle")
            # a later alert to the same user: no second template until they write again
            result = await gw.deliverer.send(Route("whatsapp", USER), "an alert")
            assert not result.ok and "already sent" in (result.error or "")
    assert wa.texts(USER) == ["echo: first question"]
    assert len(wa.sent_to(USER, "template")) == 1
    [tpl] = log_events(logs, "whatsapp_window_template")
    assert tpl["to"] == USER and tpl["template"] == "reopen_chat"
    assert log_events(logs, "outbox_sent", channel="whatsapp")
    dead = [p for p in (tmp_path / "state" / "outbox" / "dead").glob("*.json")]
    [letter] = [json.loads(p.read_text()) for p in dead]
    assert letter["message"]["text"] == "echo: second question"
    assert "template 'reopen_chat' sent instead" in letter["last_error"]


async def test_reengagement_refused_without_a_template(tmp_path, model, wa):
    """Meta answers 131047 (its window is closed although ours looked open): without a
    window template the reply is refused, logged and recorded as the message's outcome;
    a status callback with 131047 is logged as a failed delivery."""
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, wa)) as gw:
            hook_to(wa, gw)
            model.script_text("a reply Meta will refuse", delay=0.3)
            await wa.inject_text(USER, "late question")
            await until(lambda: chat_requests(model), what="the model call")
            wa.last_user_message.pop(USER)  # Meta counts the window as closed
            await until(lambda: len(gw.journal.outcomes) == 1, what="the outcome")
            [row] = gw.journal.outcomes.select()
            await wa.send_status("wamid.EARLIER", USER, "failed", error={
                "code": 131047, "title": "Re-engagement message",
                "error_data": {"details": "more than 24 hours"}})
            await until(lambda: log_events(logs, "whatsapp_message_failed"),
                        what="the failed status")
            status = gw.status()["channels"]["whatsapp"]
    assert not wa.accepted
    assert row["outcome"] == "failed" and row["channel"] == "whatsapp"
    assert "24-hour customer service window" in row["detail"]
    assert "window_template" in row["detail"]
    assert log_events(logs, "whatsapp_window_refused", to=USER)
    [failed] = log_events(logs, "whatsapp_message_failed")
    assert failed["code"] == 131047 and status["failed_deliveries"] == 1


async def test_restart_without_loss_or_double(tmp_path, model, wa):
    """A reply that could not go out before a stop is delivered once by the next run
    (the outbox, and the 24-hour window remembered on disk); Meta redelivering the
    original notification to the new run does not answer it again."""
    cfg = config(tmp_path, model, wa)
    wa.fail(status=500, code=2, count=1000)
    async with running_gateway(cfg) as gw:
        hook_to(wa, gw)
        payload, status = await wa.inject_text(USER, "before the restart")
        assert status == 200
        await until(lambda: outbox_files(gw.state_dir), what="the outbox entry")
    wa._failures.clear()
    windows = json.loads((tmp_path / "state" / "channels" /
                          "whatsapp-default-windows.json").read_text())
    assert USER in windows["last"]
    async with running_gateway(cfg) as gw:
        hook_to(wa, gw)
        await until(lambda: wa.texts(USER), what="the reply after the restart")
        assert await wa.redeliver(payload) == 200
        await until(lambda: not outbox_files(gw.state_dir), what="the outbox to drain")
    assert wa.texts(USER) == ["echo: before the restart"]
    assert len(chat_requests(model)) == 1


async def test_pairing_over_whatsapp(tmp_path, model, wa):
    """The default DM policy: an unknown sender gets a pairing code on WhatsApp, the
    operator approves it with ``tidegate pairing approve whatsapp <code>``, the sender
    is greeted and answered from then on."""
    cfg = config(tmp_path, model, wa, dm_policy="pairing")
    path = write_config(tmp_path, cfg)
    async with running_gateway(cfg) as gw:
        hook_to(wa, gw)
        await wa.inject_text(USER, "hi, who are you?", name="Ana")
        [notice] = await until(lambda: wa.texts(USER), what="the pairing code")
        code = notice.split("pairing code is ")[1].split(".")[0]
        assert f"tidegate pairing approve whatsapp {code}" in notice
        rc, out, err = await run_cli(path, "pairing", "approve", "whatsapp", code)
        assert rc == 0 and f"approved whatsapp sender {USER} (Ana)" in out, err
        await until(lambda: len(wa.texts(USER)) == 2, what="the greeting")
        await wa.inject_text(USER, "now may I ask?")
        await until(lambda: "echo: now may I ask?" in wa.texts(USER), what="the answer")
    assert len(chat_requests(model)) == 1


def test_signature_is_meta_s_hmac():
    body = b'{"object":"whatsapp_business_account","entry":[]}'
    expected = "sha256=" + __import__("hmac").new(b"s3", body, hashlib.sha256).hexdigest()
    assert signature("s3", body) == expected
