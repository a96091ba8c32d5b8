"""Config model of ``channels.email`` (one mailbox; several under ``accounts``), registered
by ``channels/email/plugin.py``.

It extends the shared access model only, not the chat platforms' streaming and quoting
settings: a sent mail cannot be edited, so replies are never streamed.

The access model is the other platforms' (``dm_policy``, ``allow_from``, pairing): every
mail is a direct message from its sender's address, so ``allow_from`` lists addresses
(``alice@example.org``) or whole domains (``@example.org``). Passwords come from the
environment (``${EMAIL_PASSWORD}``) like every other secret and are never logged. Both
servers' certificates are always verified, against ``tls_ca_file`` when set (a private CA
or a self-signed server), else the system's CAs; OAuth2 (XOAUTH2) logins are not supported
yet: use an app password.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from channels.config import AccessConfig, DmPolicy, PlatformSection
from channels.email.addresses import allow_entry
from runtime.config_types import Duration


class EmailAccount(AccessConfig):
    enabled: bool = Field(True, description="Connect this mailbox.")
    dm_policy: DmPolicy = Field(
        "allowlist",
        description=("pairing | allowlist | open | disabled; allowlist by default: a pairing "
                     "code mailed to any stranger would answer spam."))
    address: str | None = Field(
        None,
        description="The bot's own address: the From of its replies (bot@example.org).")
    display_name: str | None = Field(
        None, description="Name shown with the From address; null = the address alone.")
    imap_host: str | None = Field(None, description="IMAP server host name.")
    imap_port: int = Field(993, ge=1, le=65535, description="IMAP port (993 for TLS, 143 for STARTTLS or none).")
    imap_security: Literal["tls", "starttls", "none"] = Field(
        "tls",
        description=("tls (implicit TLS, port 993) | starttls (port 143, upgraded with STARTTLS "
                     "before the login; a server that does not offer it is refused) | none "
                     "(plain text: only for a server on the same host)."))
    tls_ca_file: str | None = Field(
        None,
        description=("A PEM file of CA certificates (or the server's self-signed certificate) "
                     "that the IMAP and SMTP servers' certificates are verified against; null = "
                     "the system's trusted CAs. Verification (host name included) is never off."))
    imap_username: str | None = Field(None, description="IMAP login; null = address.")
    imap_password: str | None = Field(
        None, description="IMAP password (keep it in the environment: ${EMAIL_PASSWORD}).")
    mailbox: str = Field("INBOX", description="The folder watched for new mail.")
    smtp_host: str | None = Field(None, description="SMTP server host name; null = imap_host.")
    smtp_port: int = Field(587, ge=1, le=65535, description="SMTP submission port (587 STARTTLS, 465 TLS).")
    smtp_security: Literal["starttls", "tls", "none"] = Field(
        "starttls", description="starttls (port 587) | tls (port 465) | none (local relay).")
    smtp_username: str | None = Field(
        None, description="SMTP login; null = the IMAP login (no login when both are null).")
    smtp_password: str | None = Field(
        None, description="SMTP password; null = imap_password.")
    thread_sessions: bool = Field(
        True,
        description=("one session per mail thread (Message-ID / References); false = one "
                     "session per sender, as on the chat platforms."))
    subject: str = Field(
        "Message from your assistant",
        description="Subject of a mail that answers no thread (cron, heartbeat, message tool).")
    mark_seen: bool = Field(True, description="Flag each handled mail \\Seen on the server.")
    idle_timeout: Duration = Field(
        1500.0,
        description="IDLE is renewed this often (servers drop an IDLE after 30 minutes).")
    poll_interval: Duration = Field(
        60.0, description="Check interval on a server without IDLE.")
    connect_timeout: Duration = Field(
        30.0, description="Timeout of connecting, logging in and of each IMAP command.")
    send_timeout: Duration = Field(60.0, description="Timeout of one SMTP submission.")
    max_attachment_bytes: int = Field(
        20 * 1024 * 1024, ge=0,
        description="Outgoing attachments larger than this are refused (sum per mail).")
    unhealthy_after: Duration = Field(
        300.0,
        description=("Cannot reach the IMAP server this long: one ERROR, status.problems, "
                     "/readyz 503."))

    @field_validator("allow_from")
    @classmethod
    def _senders(cls, value: list[str]) -> list[str]:
        # the form a mail's sender is compared in (addresses.py): an entry that loads
        # can match; ``Name <A@x>`` and upper case are normalised, mailto: refused
        return list(dict.fromkeys(allow_entry(s) for s in value))


def _email_problems(acc: Any) -> list[str]:
    out = []
    for key in ("address", "imap_host", "imap_password"):
        if not getattr(acc, key):
            out.append(f"{key}: required when email is enabled")
    if acc.tls_ca_file and not Path(acc.tls_ca_file).expanduser().is_file():
        out.append(f"tls_ca_file: {acc.tls_ca_file} is not a file")
    if acc.address and "@" not in acc.address:
        out.append(f"address: {acc.address!r} is not an email address")
    return out


class EmailChannelConfig(PlatformSection, EmailAccount):
    enabled: bool = Field(
        False,
        description="connect this channel (its accounts, or the one account of the section itself).")
    accounts: dict[str, EmailAccount] = Field(
        {},
        description=("Several mailboxes: {<account_id>: {address: ..., any key above}}; each "
                     "inherits the keys it does not set."))
    _problems = staticmethod(_email_problems)
