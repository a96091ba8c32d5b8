"""The email channel's live check (``ChannelPlugin.probe``): an IMAP login with the
folder selected (``open_mailbox``: the same TLS, STARTTLS and certificate rules as the
channel), then SMTP: connect, EHLO (and STARTTLS or TLS), and the login when the server
offers AUTH — exactly what a reply does before it sends, without sending anything."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import aiosmtplib

from channels.email.imap import LoginRejected, open_mailbox, tls_context
from channels.email.smtp import greeted


def _why(exc: BaseException, where: str) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"{where}: certificate not trusted ({exc.verify_message}); set tls_ca_file "
                "to the CA (or the server's certificate)")
    if isinstance(exc, TimeoutError):
        return f"{where}: no answer in time"
    return f"{where} unreachable: {type(exc).__name__}: {exc}".rstrip(": ")


async def _imap(account: Any, timeout: float) -> tuple[bool, str]:
    login = account.imap_username or account.address
    where = f"IMAP {account.imap_host}:{account.imap_port} ({account.imap_security})"
    try:
        box = await asyncio.wait_for(open_mailbox(account, username=login,
                                                  password=str(account.imap_password)),
                                     timeout)
    except LoginRejected as exc:
        return False, f"{where}: login refused for {login}: {exc}"
    except Exception as exc:  # noqa: BLE001 - every other failure is "cannot reach it"
        return False, _why(exc, where)
    await box.close()
    return True, f"{where}: {login} logged in, {account.mailbox} selected"


async def _smtp(account: Any, timeout: float) -> tuple[bool, str]:
    host = account.smtp_host or account.imap_host
    security = account.smtp_security
    where = f"SMTP {host}:{account.smtp_port} ({security})"
    user = account.smtp_username or account.imap_username or account.address
    password = account.smtp_password or account.imap_password
    try:
        client = aiosmtplib.SMTP(hostname=host, port=account.smtp_port,
                                 use_tls=security == "tls", start_tls=security == "starttls",
                                 timeout=timeout,
                                 tls_context=tls_context(account) if security != "none"
                                 else None)
        await greeted(client)
    except Exception as exc:  # noqa: BLE001
        return False, _why(exc, where)
    try:
        if not (password and client.supports_extension("auth")):
            return True, f"{where}: EHLO answered (no login offered)"
        await client.login(user, str(password))
        return True, f"{where}: {user} logged in"
    except aiosmtplib.SMTPAuthenticationError as exc:
        return False, f"{where}: login refused for {user} ({exc.code})"
    except Exception as exc:  # noqa: BLE001
        return False, _why(exc, where)
    finally:
        try:
            await client.quit()
        except (aiosmtplib.SMTPException, OSError):
            client.close()


async def probe(account: Any, timeout: float) -> tuple[bool, str]:
    """``(True, "IMAP ...: bot@x logged in, INBOX selected; SMTP ...: ...")`` or
    ``(False, why)``: a refused IMAP or SMTP login, an untrusted certificate (with the
    hint to set ``tls_ca_file``), an unreachable server. SMTP is checked only after IMAP
    worked."""
    ok, imap = await _imap(account, timeout)
    if not ok:
        return False, imap
    ok, smtp = await _smtp(account, timeout)
    return ok, f"{imap}; {smtp}"
