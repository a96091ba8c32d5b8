"""Outbound mail: a reply (or a new mail) as an RFC 5322 message.

A reply carries ``In-Reply-To: <the mail it answers>`` and ``References: <the thread's
chain>`` (RFC 5322 section 3.6.4), so every mail client files it under the thread, and the
thread's subject with one ``Re:``. The body is the model's markdown as ``text/plain``
(markdown reads well as plain text) with an HTML alternative rendered from it (raw HTML in
the model's text is escaped, never passed through). ``Auto-Submitted: auto-replied``
(RFC 3834) tells other robots not to answer it. The ``Message-ID`` is derived from the
delivery's idempotency key, so a retried delivery carries the same id.
"""

from __future__ import annotations

import hashlib
import mimetypes
import re
from email.message import EmailMessage
from email.utils import formataddr, formatdate, make_msgid
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

_RE = re.compile(r"^\s*(re|aw|sv|antw)\s*:\s*", re.IGNORECASE)
_md = MarkdownIt("commonmark", {"html": False, "linkify": False})


def reply_subject(subject: str | None, default: str) -> str:
    """``Re: <subject>`` (one ``Re:``, whatever the client prefixed); ``default`` when
    there is no subject."""
    base = (subject or "").strip()
    while _RE.match(base):
        base = _RE.sub("", base, count=1)
    return f"Re: {base}" if base else default


def message_id_for(key: str | None, address: str) -> str:
    """``<hash@domain>`` stable for one idempotency ``key`` (a fresh id without one)."""
    domain = address.rpartition("@")[2] or "localhost"
    if not key:
        return make_msgid(domain=domain)
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"<{digest}@{domain}>"


def compose(*, sender: str, display_name: str | None, to: str, text: str,
            subject: str, in_reply_to: str | None, references: list[str],
            message_id: str, files: list[str], now: float) -> EmailMessage:
    """The mail to send (module docstring). ``files`` are absolute paths, attached in
    order under their base names. Raises OSError when a file cannot be read."""
    msg = EmailMessage()
    msg["From"] = formataddr((display_name, sender)) if display_name else sender
    msg["To"] = to
    msg["Subject"] = subject
    msg["Date"] = formatdate(now, localtime=False, usegmt=True)
    msg["Message-ID"] = message_id
    if in_reply_to:
        msg["In-Reply-To"] = in_reply_to
    if references:
        msg["References"] = " ".join(references)
    msg["Auto-Submitted"] = "auto-replied" if in_reply_to else "auto-generated"
    msg.set_content(text or "")
    if text.strip():
        msg.add_alternative(_html(text), subtype="html")
    for path in files:
        _attach(msg, Path(path))
    return msg


def _html(markdown: str) -> str:
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body>"
            f"{_md.render(markdown)}</body></html>")


def _attach(msg: EmailMessage, path: Path) -> None:
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    maintype, _, subtype = mime.partition("/")
    msg.add_attachment(path.read_bytes(), maintype=maintype, subtype=subtype,
                       filename=path.name)


def thread_headers(thread: dict[str, Any] | None, reply_to: str | None
                   ) -> tuple[str | None, list[str]]:
    """``(In-Reply-To, References)`` for a reply to ``reply_to`` in ``thread`` (its
    remembered chain; None: unknown)."""
    refs = list((thread or {}).get("refs") or [])
    if reply_to and reply_to not in refs:
        refs.append(reply_to)
    in_reply_to = reply_to or (refs[-1] if refs else None)
    return in_reply_to, refs
