"""Email against real servers: Dovecot for IMAP, aiosmtpd for SMTP (tests/mail_servers.py).

Each "DM" is a mail from the test user; every mail after the first answers the first
(``In-Reply-To``/``References``), so all of them are one thread and one session. The mails
have no subject (the first mail of a thread shows the model its subject, which would
change the echo). A redelivery is the same bytes appended again (a new UID, the same
Message-ID). The outage stops Dovecot (the IMAP connection drops) and makes the SMTP server
answer 451 until it is back. Email has no groups, no split replies and no streaming (all
three said on docs/channels/email.md).
"""

from __future__ import annotations

import asyncio
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any

from tests.conformance.driver import ChannelDriver
from tests.mail_servers import PASSWORD, Dovecot, SmtpSink

BOT = "bot@tide.test"
USER = "alice@example.org"


class EmailDriver(ChannelDriver):
    name = "email"
    limit = 1_000_000
    streams = False
    groups = False
    splits = False

    async def start(self) -> None:
        self.imap = await asyncio.to_thread(lambda: Dovecot(users=("bot",)).start())
        self.smtp = SmtpSink().start()
        self.root = make_msgid(domain="example.org")  # the first mail's id: the thread
        self.sent = 0
        self.dm_key = f"agent:main:email:dm:{USER}:thread:{self.root}"

    async def stop(self) -> None:
        self.smtp.stop()
        await asyncio.to_thread(self.imap.close)

    def section(self, **overrides: Any) -> dict[str, Any]:
        overrides.pop("streaming", None)  # a mail cannot be edited: no streaming setting
        return {"enabled": True, "address": BOT, "imap_host": "127.0.0.1",
                "imap_port": self.imap.port, "imap_security": "none",
                "imap_username": "bot", "imap_password": PASSWORD,
                "smtp_host": "127.0.0.1", "smtp_port": self.smtp.port,
                "smtp_security": "none", "dm_policy": "open", **overrides}

    def _mail(self, text: str) -> EmailMessage:
        msg = EmailMessage()
        msg["From"], msg["To"] = USER, BOT
        msg["Message-ID"] = self.root if not self.sent else make_msgid(domain="example.org")
        if self.sent:
            msg["In-Reply-To"] = msg["References"] = self.root
        self.sent += 1
        msg.set_content(text)
        return msg

    async def _deliver(self, msg: EmailMessage) -> EmailMessage:
        await asyncio.to_thread(self.imap.deliver, msg)
        return msg

    async def dm(self, text: str) -> Any:
        return await self._deliver(self._mail(text))

    async def dm_file(self, text: str, name: str, data: bytes, mime: str) -> Any:
        msg = self._mail(text)
        maintype, _, subtype = mime.partition("/")
        msg.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
        return await self._deliver(msg)

    async def redeliver(self, handle: Any) -> None:
        await self._deliver(handle)

    def _replies(self) -> list[EmailMessage]:
        return [m for m in self.smtp.mails() if m["To"] == USER]

    def dm_texts(self) -> list[str]:
        return [m.get_body(("plain",)).get_content().replace("\r\n", "\n").rstrip("\n")
                for m in self._replies()]

    def group_texts(self) -> list[str]:
        return []

    def dm_uploads(self) -> list[tuple[str, bytes]]:
        return [(p.get_filename(), p.get_payload(decode=True)) for m in self._replies()
                for p in m.iter_attachments()]

    async def outage(self, down: bool) -> None:
        if down:
            self.smtp.down = True
            await asyncio.to_thread(self.imap.stop)
        else:
            await asyncio.to_thread(self.imap.start)
            self.smtp.down = False


DRIVER = EmailDriver()
