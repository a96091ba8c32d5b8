"""The email adapter on its own against real servers (Dovecot, aiosmtpd): HTML mail, the
mailbox generation (UIDVALIDITY) changing under it, mail that arrives during an IMAP
outage, a corrupt checkpoint, a refused login, and how SMTP answers map to delivery
results. The whole gateway: tests/test_gateway_email.py
and the conformance suite (tests/conformance/drivers/email.py)."""

from __future__ import annotations

import asyncio
import json
import os
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from channels.base import InboundMessage, OutboundMessage
from channels.email.adapter import EmailChannel
from channels.email.config import EmailAccount
from gateway.channels.health import likely_cause
from tests.channel_harness import log_events, until
from tests.mail_servers import PASSWORD, Dovecot, SmtpSink

pytestmark = pytest.mark.timeout(40)
BOT = "bot2@tide.test"


@pytest.fixture(scope="module")
def dovecot():
    server = Dovecot(users=("bot2",)).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def smtp():
    sink = SmtpSink().start()
    yield sink
    sink.stop()


def account(dovecot: Dovecot, smtp: SmtpSink, **extra: Any) -> EmailAccount:
    keys = {"address": BOT, "imap_host": "127.0.0.1", "imap_port": dovecot.port,
            "imap_security": "none", "imap_username": "bot2", "imap_password": PASSWORD,
            "smtp_host": "127.0.0.1", "smtp_port": smtp.port, "smtp_security": "none"}
    return EmailAccount(**{**keys, **extra})


class Inbox:
    """Stands in for the gateway's intake: keeps what the adapter hands on."""

    def __init__(self) -> None:
        self.got: list[InboundMessage] = []

    async def on_message(self, msg: InboundMessage) -> str:
        self.got.append(msg)
        return "queued"

    async def on_event(self, _event: Any) -> None:
        pass


def mail(text: str) -> EmailMessage:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "alice@example.org", BOT, "Hello"
    msg["Message-ID"] = make_msgid(domain="example.org")
    msg.set_content(text)
    return msg


async def started(cfg: EmailAccount, inbox: Inbox, path: Path) -> EmailChannel:
    ch = EmailChannel("default", cfg, checkpoint=path)
    await ch.start(inbox.on_message, inbox.on_event)
    return ch


async def test_html_mail_is_read_as_text_and_plain_wins_when_both(tmp_path, dovecot, smtp):
    inbox = Inbox()
    ch = await started(account(dovecot, smtp), inbox, tmp_path / "cp.json")
    both = mail("the plain version")
    both.add_alternative("<p>the <b>HTML</b> version</p>", subtype="html")
    only = mail("")
    only.set_content("<html><head><style>p {color: red}</style><script>steal()</script>"
                     "</head><body><p>Low tide <i>at noon</i>?</p><ul><li>first</li>"
                     "<li>second</li></ul></body></html>", subtype="html")
    for m in (both, only):
        await asyncio.to_thread(dovecot.deliver, m, "bot2")
    await until(lambda: len(inbox.got) == 2, what="both mails")
    await ch.stop()
    assert inbox.got[0].text == "Subject: Hello\n\nthe plain version"
    html = inbox.got[1].text
    assert "Low tide at noon?\n" in html and "first\nsecond" in html
    assert "steal" not in html and "color" not in html and "<" not in html


async def test_mail_sent_during_an_outage_comes_after_the_reconnect(tmp_path, dovecot, smtp):
    inbox = Inbox()
    with capture_logs() as logs:
        ch = await started(account(dovecot, smtp), inbox, tmp_path / "cp.json")
        await asyncio.to_thread(dovecot.stop)  # the connection drops with the server
        await until(lambda: ch.state == "reconnecting", what="the outage noticed")
        late = mail("sent during the outage")
        drop(dovecot, late, "bot2")  # delivered into the maildir meanwhile, as an MDA does
        await asyncio.to_thread(dovecot.start)
        await until(lambda: inbox.got, timeout=15, what="the mail after the reconnect")
        status = ch.status()
        await ch.stop()
    assert [m.message_id for m in inbox.got] == [late["Message-ID"]]
    assert status["state"] == "connected" and status["reconnects"] == 1
    assert log_events(logs, "email_reconnect_scheduled")


def drop(dovecot: Dovecot, msg: EmailMessage, user: str) -> None:
    """Write ``msg`` into ``user``'s maildir ``new/`` (the server may be down)."""
    path = dovecot.dir / "mail" / user / "new" / f"1700000000.M1P{os.getpid()}.tidegate"
    path.write_bytes(msg.as_bytes())
    if os.geteuid() == 0:
        owner = path.parent.stat()
        os.chown(path, owner.st_uid, owner.st_gid)


async def test_a_new_uidvalidity_rescans_since_the_checkpoint(tmp_path, dovecot, smtp):
    path, inbox = tmp_path / "email-default-checkpoint.json", Inbox()
    ch = await started(account(dovecot, smtp), inbox, path)
    first = mail("before the rebuild")
    await asyncio.to_thread(dovecot.deliver, first, "bot2")
    await until(lambda: inbox.got, what="the first mail")
    await ch.stop()
    old = json.loads(path.read_text())
    # the server renumbers the folder (a restore, a migration): new UIDVALIDITY, new UIDs
    await asyncio.to_thread(dovecot.stop)
    dovecot.renumber("bot2", old["uidvalidity"] + 1000)
    await asyncio.to_thread(dovecot.start)
    second = mail("after the rebuild")
    await asyncio.to_thread(dovecot.deliver, second, "bot2")
    with capture_logs() as logs:
        ch = await started(account(dovecot, smtp), inbox, path)
        await until(lambda: inbox.got[-1].message_id == second["Message-ID"],
                    what="the rescan")
        await ch.stop()
    # today's mail comes again with its Message-IDs (the gateway's dedupe drops what it
    # handled: tests/conformance redelivers the same way), then the new mail, once
    ids = [m.message_id for m in inbox.got]
    assert ids[0] == first["Message-ID"] and first["Message-ID"] in ids[1:-1]
    assert ids.count(second["Message-ID"]) == 1
    [changed] = log_events(logs, "email_uidvalidity_changed")
    assert changed["previous"] == old["uidvalidity"] != changed["uidvalidity"]
    new = json.loads(path.read_text())
    assert new["uidvalidity"] == changed["uidvalidity"]
    assert new["uid"] == len(ids) - 1  # every mail of the renumbered folder, in UID order


async def test_a_corrupt_checkpoint_is_kept_aside_and_new_mail_still_comes(
        tmp_path, dovecot, smtp):
    path, inbox = tmp_path / "email-default-checkpoint.json", Inbox()
    path.write_text("{not json")
    with capture_logs() as logs:
        ch = await started(account(dovecot, smtp), inbox, path)
        uid = await asyncio.to_thread(dovecot.deliver, mail("after the corruption"), "bot2")
        await until(lambda: inbox.got, what="the new mail")
        await ch.stop()  # at once: the mail was handed on, so the checkpoint moves past it
    [corrupt] = log_events(logs, "state_file_corrupt", owner="email checkpoint")
    assert "kept in" in corrupt["fix"]
    assert [p.read_text() for p in tmp_path.glob("*.corrupt-*")] == ["{not json"]
    assert json.loads(path.read_text())["uid"] == uid
    assert inbox.got[0].text.endswith("after the corruption")


class Gatekeeper(Inbox):
    """Accepts Alice; answers anyone else as the gateway does under ``dm_policy: pairing``:
    a pairing notice in the sender's thread, the outcome ``pairing``."""

    channel: EmailChannel

    async def on_message(self, msg: InboundMessage) -> str:
        self.got.append(msg)
        if msg.sender_id == "alice@example.org":
            return "queued"
        await self.channel.send(OutboundMessage(
            channel="email", to=msg.sender_id, text="Your pairing code: 4KQ7",
            thread_id=msg.thread_id, reply_to=msg.message_id, idempotency_key="pair-1"))
        return "pairing"


async def test_a_refused_senders_mail_leaves_only_the_uid_in_the_checkpoint(
        tmp_path, dovecot, smtp):
    path, inbox = tmp_path / "email-default-checkpoint.json", Gatekeeper()
    smtp.received.clear()
    inbox.channel = ch = EmailChannel("default", account(dovecot, smtp), checkpoint=path)
    await ch.start(inbox.on_message, inbox.on_event)
    stranger = mail("who is this?")
    stranger.replace_header("From", "mallory@evil.test")
    stranger.replace_header("Subject", "Invoice 4471 overdue")
    for m in (stranger, mail("low tide?")):
        uid = await asyncio.to_thread(dovecot.deliver, m, "bot2")
    await until(lambda: len(inbox.got) == 2, what="both mails")
    await ch.stop()
    [notice] = smtp.mails()  # threaded while the gateway decided
    assert notice["Subject"] == "Re: Invoice 4471 overdue"
    assert notice["In-Reply-To"] == stranger["Message-ID"]
    saved = json.loads(path.read_text())
    assert saved["uid"] == uid  # both handled: the stranger's mail is not fetched again
    assert [t["subject"] for t in saved["threads"].values()] == ["Hello"]
    assert "Invoice" not in path.read_text() and stranger["Message-ID"] not in saved["ids"]
    assert notice["Message-ID"] not in saved["ids"]


async def test_a_refused_login_fails_at_once_and_never_logs_the_password(
        tmp_path, dovecot, smtp):
    wrong = "wrong-pass-5f2c9"
    cfg = account(dovecot, smtp).model_copy(update={"imap_password": wrong})
    with capture_logs() as logs:
        ch = await started(cfg, Inbox(), tmp_path / "cp.json")
        assert ch.state == "failed"
        assert "login refused" in ch.status()["last_error"]
        # what `tidegate status` and /readyz then name as the likely cause
        assert "imap_password" in likely_cause("email", "failed", ch.status()["last_error"])
        await ch.stop()
    assert log_events(logs, "email_channel_failed")
    assert not log_events(logs, "email_reconnect_scheduled")  # no retry: no lock-out
    assert wrong not in json.dumps(logs, default=str)


async def test_smtp_answers_map_to_retry_or_refusal(tmp_path, dovecot, smtp):
    ch = EmailChannel("default", account(dovecot, smtp), checkpoint=tmp_path / "cp.json")
    smtp.received.clear()
    out = OutboundMessage(channel="email", to="carol@example.org", text="hello",
                          idempotency_key="k-1")
    smtp.refuse_next(1, "451 4.7.1 greylisted, try again later")
    busy = await ch.send(out)
    assert not busy.ok and busy.retryable and "451" in busy.error
    smtp.refuse_next(1, "550 5.1.1 no such user")
    gone = await ch.send(out)
    assert not gone.ok and not gone.retryable and "550" in gone.error
    ok = await ch.send(out)
    again = await ch.send(out)  # an outbox retry of the same delivery: the same Message-ID
    assert ok.ok and ok.message_ids == again.message_ids
    [first, second] = smtp.mails()
    assert first["Message-ID"] == second["Message-ID"] == ok.message_ids[0]
    assert first["Subject"] == "Message from your assistant"  # answers no thread
    bad = await ch.send(OutboundMessage(channel="email", to="x@y\r\nBcc: z@w", text="hi"))
    assert not bad.ok and not bad.retryable and "invalid email address" in bad.error
    big = tmp_path / "big.bin"
    big.write_bytes(b"0" * 2048)
    small = account(dovecot, smtp, max_attachment_bytes=1024)
    refused = await EmailChannel("default", small).send(
        OutboundMessage(channel="email", to="carol@example.org", text="", media=[str(big)]))
    assert not refused.ok and "max_attachment_bytes" in refused.error
    assert len(smtp.received) == 2


async def test_imap_over_starttls_and_implicit_tls_with_the_certificate_verified(
        tmp_path, dovecot, smtp):
    """STARTTLS on the plain port and implicit TLS on the TLS port, both verified against
    ``tls_ca_file`` (the server's self-signed certificate); without it the system's CAs
    do not trust the server and the channel never logs in (it retries, naming why)."""
    ca = str(dovecot.ca_file)
    for security, port in (("starttls", dovecot.port), ("tls", dovecot.tls_port)):
        inbox = Inbox()
        cfg = account(dovecot, smtp, imap_security=security, imap_port=port, tls_ca_file=ca)
        ch = await started(cfg, inbox, tmp_path / f"{security}.json")
        assert ch.state == "connected", ch.status()
        dovecot.deliver(mail(f"over {security}"), user="bot2")
        await until(lambda inbox=inbox: inbox.got)
        assert inbox.got[0].text.endswith(f"over {security}")
        await ch.stop()
    untrusted = account(dovecot, smtp, imap_security="starttls")
    ch = await started(untrusted, Inbox(), tmp_path / "untrusted.json")
    assert ch.state == "reconnecting"
    assert "CERTIFICATE_VERIFY_FAILED" in ch.status()["last_error"]
    await ch.stop()


async def test_the_probe_logs_in_to_both_servers_and_names_a_refused_login(dovecot, smtp):
    from channels.email.plugin import PLUGIN
    from channels.probing import check_account
    ok, detail = await check_account(PLUGIN, account(dovecot, smtp, imap_security="starttls",
                                                     tls_ca_file=str(dovecot.ca_file)))
    assert ok is True, detail
    assert detail == (f"IMAP 127.0.0.1:{dovecot.port} (starttls): bot2 logged in, INBOX "
                      f"selected; SMTP 127.0.0.1:{smtp.port} (none): EHLO answered (no "
                      "login offered)")
    wrong = "wrong-pass-77a1"
    ok, detail = await check_account(PLUGIN, account(dovecot, smtp, imap_password=wrong))
    assert ok is False and "login refused for bot2" in detail and wrong not in detail
    guarded = SmtpSink(password="smtp-pass-1").start()  # offers AUTH, one password only
    try:
        good = account(dovecot, guarded, smtp_username="bot2", smtp_password="smtp-pass-1")
        ok, detail = await check_account(PLUGIN, good)
        assert ok is True and detail.endswith("(none): bot2 logged in"), detail
        # a reply logs in too (aiosmtplib says EHLO at connect only for STARTTLS: without
        # it AUTH looked absent and the mail went out without a login, refused with 530)
        sent = await EmailChannel("default", good).send(OutboundMessage(
            channel="email", to="carol@example.org", text="hi", idempotency_key="k-auth"))
        assert sent.ok, sent.error
        assert len(guarded.received) == 1
        guarded.received.clear()
        bad = good.model_copy(update={"smtp_password": "smtp-wrong-2"})
        ok, detail = await check_account(PLUGIN, bad)
        assert ok is False, detail
        assert detail.endswith(f"; SMTP 127.0.0.1:{guarded.port} (none): login refused for "
                               "bot2 (535)"), detail
    finally:
        guarded.stop()
    assert not guarded.received  # a probe sends nothing
