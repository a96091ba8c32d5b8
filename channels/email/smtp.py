"""The SMTP side of the email channel (``aiosmtplib``): one submission per reply.

Outcome mapping (``channels.base.DeliveryResult``):

- connect refused / DNS / TLS handshake, a 4xx answer (greylisting, server busy),
  ``SMTPServerDisconnected`` before DATA: certainly not sent -> ``retryable`` (the outbox
  retries it, with the same Message-ID).
- a 5xx answer (recipient refused, message rejected): ``retryable=False``, the error named.
- a timeout or a dropped connection once the submission began (after the login): the
  server may have queued it ->
  ``unconfirmed`` (never sent twice).
- a wrong password (535): not retryable, logged without the password.
"""

from __future__ import annotations

from email.message import EmailMessage
from typing import Any

import aiosmtplib

from channels.base import DeliveryResult
from channels.email.imap import tls_context


async def submit(cfg: Any, message: EmailMessage, *, username: str | None,
                 password: str | None) -> DeliveryResult:
    """Send ``message`` through ``cfg.smtp_host`` (the module docstring maps failures),
    logging in with ``username``/``password`` when the server offers AUTH."""
    host = cfg.smtp_host or cfg.imap_host
    try:
        context = tls_context(cfg) if cfg.smtp_security != "none" else None
    except OSError as exc:  # an unreadable or invalid CA file: nothing was sent
        return DeliveryResult(ok=False, retryable=True, error=f"tls_ca_file: {exc}"[:300])
    client = aiosmtplib.SMTP(hostname=host, port=cfg.smtp_port,
                             use_tls=cfg.smtp_security == "tls",
                             start_tls=cfg.smtp_security == "starttls",
                             timeout=float(cfg.send_timeout), tls_context=context)
    data_started = False
    try:
        await greeted(client)
        if username and password and client.supports_extension("auth"):
            await client.login(username, password)
        data_started = True
        _errors, _text = await client.send_message(message)
    except aiosmtplib.SMTPAuthenticationError as exc:
        return DeliveryResult(ok=False, error=f"SMTP login refused ({exc.code})")
    except aiosmtplib.SMTPRecipientsRefused as exc:
        return DeliveryResult(ok=False, error=f"SMTP refused the recipient: {_first(exc)}",
                              retryable=any(500 > r.code >= 400 for r in exc.recipients))
    except aiosmtplib.SMTPResponseException as exc:
        return DeliveryResult(ok=False, error=f"SMTP {exc.code}: {exc.message}"[:300],
                              retryable=400 <= exc.code < 500)
    except (aiosmtplib.SMTPTimeoutError, aiosmtplib.SMTPServerDisconnected) as exc:
        if data_started:
            return DeliveryResult(ok=False, unconfirmed=True,
                                  error=f"SMTP outcome unknown: {type(exc).__name__}")
        return DeliveryResult(ok=False, retryable=True, error=f"SMTP: {exc}"[:300])
    except (aiosmtplib.SMTPException, OSError) as exc:
        return DeliveryResult(ok=False, retryable=True,
                              error=f"SMTP unreachable: {type(exc).__name__}: {exc}"[:300])
    finally:
        if client.is_connected:
            try:
                await client.quit()
            except (aiosmtplib.SMTPException, OSError):
                client.close()
    return DeliveryResult(ok=True, message_ids=[str(message["Message-ID"])])


async def greeted(client: aiosmtplib.SMTP) -> None:
    """Connect and make sure EHLO was answered: aiosmtplib says EHLO at connect only when
    it negotiates STARTTLS, and without it ``supports_extension("auth")`` is False, so on
    implicit TLS (465) or a plain relay the login would be skipped."""
    await client.connect()
    if client.last_ehlo_response is None:
        await client.ehlo()


def _first(exc: aiosmtplib.SMTPRecipientsRefused) -> str:
    r = exc.recipients[0] if exc.recipients else None
    return f"{r.recipient} ({r.code} {r.message})"[:200] if r else str(exc)[:200]
