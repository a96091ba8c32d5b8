"""The email channel through the whole gateway, against real mail servers: Dovecot for
IMAP (tests/mail_servers.py, started once for this module) and aiosmtpd as the SMTP
server the gateway submits its replies to; the fake OpenAI model answers.

Incoming mail is put into Dovecot with IMAP APPEND; the gateway's replies are read back
from the SMTP sink. Attachments in and out, a restart, an outage and reconnect and a
redelivery are the conformance suite's (tests/conformance/drivers/email.py); the adapter
alone (UIDVALIDITY, corrupt checkpoint, HTML, SMTP answers): tests/test_email_channel.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.config.load import parse_config
from gateway.service.daemon import Gateway
from tests.channel_harness import chat_requests, last_user_text, log_events, until
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, stored_sessions
from tests.mail_servers import PASSWORD, Dovecot, SmtpSink

pytestmark = pytest.mark.timeout(60)

BOT = "bot@tide.test"
ALICE = "alice@example.org"


@pytest.fixture(scope="module")
def dovecot():
    server = Dovecot(users=("bot",)).start()  # a missing dovecot fails here, never skips
    yield server
    server.close()


@pytest.fixture(scope="module")
def smtp():
    sink = SmtpSink().start()
    yield sink
    sink.stop()


@pytest.fixture
def sink(smtp):
    smtp.received.clear()
    return smtp


def config(tmp_path: Path, model: FakeOpenAI, dovecot: Dovecot, smtp: SmtpSink,
           **extra: Any) -> dict:
    section = {"enabled": True, "address": BOT, "display_name": "Tide Bot",
               "imap_host": "127.0.0.1", "imap_port": dovecot.port, "imap_security": "none",
               "imap_username": "bot", "imap_password": "${EMAIL_PASSWORD}",
               "smtp_host": "127.0.0.1", "smtp_port": smtp.port, "smtp_security": "none",
               "allow_from": [ALICE, "@friends.test"], **extra}
    return base_config(tmp_path / "state", model.base_url, channels={"email": section})


@contextlib.asynccontextmanager
async def gateway(cfg: dict) -> AsyncIterator[Gateway]:
    """The real gateway with the IMAP password in its environment (``${EMAIL_PASSWORD}``)."""
    gw = Gateway(parse_config(cfg, "test", env={"EMAIL_PASSWORD": PASSWORD}))
    await gw.start()
    try:
        await until(lambda: gw.status()["channels"]["email"]["state"] == "connected",
                    what="the mailbox connected")
        yield gw
    finally:
        await gw.stop()


def mail(sender: str, subject: str, body: str, *, reply_to: EmailMessage | None = None,
         **headers: str) -> EmailMessage:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = sender, BOT, subject
    msg["Message-ID"] = make_msgid(domain=sender.partition("@")[2])
    if reply_to is not None:
        msg["In-Reply-To"] = reply_to["Message-ID"]
        msg["References"] = " ".join(filter(None, [str(reply_to.get("References", "")),
                                                   reply_to["Message-ID"]]))
    for k, v in headers.items():
        msg[k.replace("_", "-")] = v
    msg.set_content(body)
    return msg


def email_sessions(state_dir: Path) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in stored_sessions(state_dir).items() if ":email:" in k}


async def test_threaded_reply_follow_up_same_session_and_strangers_refused(
        tmp_path, model, dovecot, sink):
    with capture_logs() as logs:
        async with gateway(config(tmp_path, model, dovecot, sink)) as gw:
            first = mail(f"Alice <{ALICE}>", "Tides this week", "When is low tide today?")
            uid = dovecot.deliver(first)
            [(env_from, rcpts, _)] = await until(lambda: sink.received, what="the reply")
            [reply] = sink.mails()
            assert (env_from, rcpts) == (BOT, [ALICE])
            assert reply["From"] == f"Tide Bot <{BOT}>" and reply["To"] == ALICE
            assert reply["Subject"] == "Re: Tides this week"
            assert reply["In-Reply-To"] == first["Message-ID"]
            assert reply["References"] == first["Message-ID"]
            assert reply["Auto-Submitted"] == "auto-replied"
            assert "When is low tide today?" in reply.get_body(("plain",)).get_content()
            assert reply.get_body(("html",)) is not None
            assert "Subject: Tides this week" in last_user_text(chat_requests(model)[0])
            await until(lambda: "\\Seen" in dovecot.flags(uid), what="the mail flagged seen")
            from gateway.cli.output import render_status
            await until(lambda: gw.status()["channels"]["email"]["uid"] == uid,
                        what="the checkpoint at the mail")
            assert f"channel email: connected (mailbox INBOX, last handled UID {uid})" in \
                render_status(gw.status())

            # a stranger, a forged auto-reply from Alice and a bounce never start a turn
            stranger = mail("mallory@evil.test", "Invoice 4471 overdue", "let me in")
            dovecot.deliver(stranger)
            dovecot.deliver(mail(ALICE, "Out of office", "away", Auto_Submitted="auto-replied"))
            dovecot.deliver(mail("mailer-daemon@example.org", "Undelivered", "bounce"))
            # a follow-up in the thread, from a client that sends In-Reply-To only
            follow = mail(ALICE, "Re: Tides this week", "And tomorrow?\n\n"
                          "On Mon, Tide Bot wrote:\n> old text", )
            follow["In-Reply-To"] = reply["Message-ID"]
            dovecot.deliver(follow)
            await until(lambda: len(sink.received) == 2, what="the follow-up reply")
            second = sink.mails()[1]
            assert second["In-Reply-To"] == follow["Message-ID"]
            assert second["References"].split() == [first["Message-ID"], reply["Message-ID"],
                                                    follow["Message-ID"]]
            assert second["Subject"] == "Re: Tides this week"
            # a mail from an allowed domain starts a thread (and a session) of its own
            dovecot.deliver(mail("bob@friends.test", "Hello", "Hi from Bob"))
            await until(lambda: len(sink.received) == 3, what="Bob's reply")
            assert sink.received[2][1] == ["bob@friends.test"]
            state_dir = gw.state_dir
    asked = [last_user_text(r) for r in chat_requests(model)]
    assert len(asked) == 3 and asked[1].endswith("And tomorrow?")  # quoted history cut
    denied = {(r["sender_id"], r["reason"]) for r in log_events(logs, "inbound_denied",
                                                                channel="email")}
    assert denied == {("mallory@evil.test", "not_in_allowlist"), (ALICE, "bot_sender"),
                      ("mailer-daemon@example.org", "bot_sender")}
    # the checkpoint keeps the accepted threads; of the refused mails only the UID
    checkpoint = json.loads((state_dir / "channels" / "email-default-checkpoint.json")
                            .read_text())
    assert checkpoint["uid"] == 6
    assert sorted(t["subject"] for t in checkpoint["threads"].values()) == [
        "Hello", "Tides this week"]
    assert stranger["Message-ID"] not in json.dumps(checkpoint)
    sessions = email_sessions(state_dir)
    alice = [k for k in sessions if k.startswith(f"agent:main:email:dm:{ALICE}:thread:")]
    assert len(alice) == 1 and len(sessions) == 2  # one thread, one session; Bob's own
    assert sessions[alice[0]]["counters"]["turns"] == 2
    assert PASSWORD not in json.dumps(logs, default=str)  # never logged, never to the model
    assert PASSWORD not in json.dumps([r.json for r in model.requests], default=str)


async def test_allow_from_entries_are_normalised_and_never_matching_forms_refused(
        tmp_path, model, dovecot, sink):
    """``Name <Addr>``, ``<addr>`` and upper case in allow_from load as the bare
    lower-cased address (the form a mail's sender is compared in), so those senders are
    answered; a ``mailto:`` entry or one without exactly one @ stops the config naming the
    key and the entry."""
    from gateway.config.load import ConfigError
    cfg = config(tmp_path, model, dovecot, sink,
                 allow_from=["Alice <ALICE@Example.org>", "<Bob@Friends.test>", "@KELP.test",
                             "email:carol@tide.test", "*@Wild.test"])
    loaded = parse_config(cfg, "test", env={"EMAIL_PASSWORD": PASSWORD})
    assert loaded.config.channels.email.allow_from == [
        ALICE, "bob@friends.test", "@kelp.test", "carol@tide.test", "@wild.test"]
    async with gateway(cfg):
        dovecot.deliver(mail(f"Alice <{ALICE.upper()}>", "Hi", "one"))
        dovecot.deliver(mail("bob@friends.test", "Hi", "two"))
        dovecot.deliver(mail("Dora@Kelp.Test", "Hi", "three"))
        await until(lambda: len(sink.received) == 3, what="three replies")
    assert sorted(r[1][0] for r in sink.received) == [ALICE, "bob@friends.test",
                                                      "dora@kelp.test"]
    for entry, why in (("mailto:alice@example.org",
                        "a mailto: link; write the address alone ('alice@example.org')"),
                       ("alice@@example.org", "not an address"),
                       ("alice.example.org", "not an address"),
                       ("Alice <alice@example.org", "not an address"),
                       ("alice@example.org.", "not an address"),
                       ("a*@example.org", "not an address")):
        bad = config(tmp_path, model, dovecot, sink, allow_from=[ALICE, entry])
        with pytest.raises(ConfigError) as exc:
            parse_config(bad, "test", env={"EMAIL_PASSWORD": PASSWORD})
        [problem] = exc.value.problems
        assert problem.startswith(f"channels.email.allow_from: {entry!r}: {why}"), problem


async def test_the_pairing_reply_is_threaded_under_the_strangers_mail(
        tmp_path, model, dovecot, sink):
    """Under dm_policy pairing a stranger's mail is answered with the pairing code in
    its thread: In-Reply-To its Message-ID, References its chain then its Message-ID,
    the subject "Re: " its own."""
    cfg = config(tmp_path, model, dovecot, sink, dm_policy="pairing", allow_from=[])
    async with gateway(cfg):
        earlier = mail("someone@else.test", "Tide tables", "the first")
        first = mail("stranger@sea.test", "Re: Tide tables", "let me in", reply_to=earlier)
        dovecot.deliver(first)
        [notice] = await until(lambda: sink.mails(), what="the pairing reply")
    assert "pairing code" in notice.get_body(("plain",)).get_content()
    assert notice["To"] == "stranger@sea.test"
    assert notice["In-Reply-To"] == first["Message-ID"]
    assert notice["References"].split() == [earlier["Message-ID"], first["Message-ID"]]
    assert notice["Subject"] == "Re: Tide tables"
    assert not chat_requests(model)
