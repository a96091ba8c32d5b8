"""Email as a channel plugin (entry point ``email`` of ``tidegate.channels``).

Imports only the config model; the adapter (aioimaplib, aiosmtplib) is imported when an
account is created. The UID checkpoint lives in ``channels/email-<account>-checkpoint.json``
(or the shared ``state_documents`` row ``email/<account>/checkpoint.json`` on PostgreSQL).
"""

from __future__ import annotations

from typing import Any

from channels.email.config import EmailChannelConfig
from channels.sdk import Capabilities, ChannelContext, ChannelPlugin, SetupField


async def probe(account: Any, timeout: float) -> tuple[bool, str]:
    """IMAP login + SMTP EHLO/login (channels/email/probe.py)."""
    from channels.email.probe import probe as log_in
    return await log_in(account, timeout)


def create(account_id: str, config: Any, context: ChannelContext) -> Any:
    """An ``EmailChannel`` for one mailbox. Raises ValueError for a missing address, IMAP
    host or password."""
    from channels.email.adapter import EmailChannel
    return EmailChannel(account_id, config, clock=context.clock, media=context.media,
                        checkpoint=context.document("checkpoint.json"))


PLUGIN = ChannelPlugin(
    name="email", config=EmailChannelConfig, create=create,
    description="A mailbox: IMAP IDLE in, SMTP out (several under accounts).",
    capabilities=Capabilities(threads=True, files=True, markup="plain",
                              text_limit=1_000_000),
    case_insensitive_ids=False, probe=probe,
    setup=(SetupField("address", "the bot's email address"),
           SetupField("imap_host", "IMAP server host name"),
           SetupField("imap_security", "IMAP security", "tls", ("tls", "starttls", "none")),
           SetupField("imap_port", "IMAP port (993 tls, 143 starttls)", "993"),
           SetupField("imap_username", "IMAP login (empty: the address)", optional=True),
           SetupField("imap_password", "IMAP password (an app password)", secret=True,
                      env="EMAIL_PASSWORD"),
           SetupField("smtp_host", "SMTP server host name (empty: the IMAP host)",
                      optional=True),
           SetupField("smtp_security", "SMTP security", "starttls",
                      ("starttls", "tls", "none")),
           SetupField("smtp_port", "SMTP port (587 starttls, 465 tls)", "587"),
           SetupField("tls_ca_file", "CA file to verify the servers with (empty: the "
                      "system's CAs)", optional=True)))
