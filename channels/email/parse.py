"""Inbound mail: RFC 5322 bytes -> the parts an ``InboundMessage`` needs.

The text is the ``text/plain`` body, else the ``text/html`` body turned into text
(``html_text``: visible text only, scripts and styles dropped, block structure kept as
line breaks). The quoted history under a reply (``> ...`` lines and the ``On <date>,
<someone> wrote:`` line above them) is cut: the thread's earlier mails are already in the
session. Attachments (and inline parts with a file name) become ``InboundMedia`` whose
``fetch`` returns the bytes already here, under the media cap.
"""

from __future__ import annotations

import email.policy
import re
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import getaddresses, parsedate_to_datetime

import html_text

from channels.email.addresses import canonical
from channels.media.model import InboundMedia, MediaTooLarge

_MSGID = re.compile(r"<[^<>\s]+>")
_WROTE = re.compile(r"^\s*(On\s.+wrote:|Le\s.+a écrit\s?:|Am\s.+schrieb.+:)\s*$",
                    re.IGNORECASE)


@dataclass
class ParsedMail:
    """What the adapter needs of one mail. Addresses are lower-cased; ``message_id``
    and ``refs`` keep their angle brackets (``<id@host>``); ``refs`` is References then
    In-Reply-To, oldest first, without duplicates. ``auto``: an automatic mail (RFC 3834
    ``Auto-Submitted``, ``Precedence: bulk|list|junk``, a bounce) that must never start a
    turn (two auto-responders would answer each other forever)."""

    sender: str
    sender_name: str | None
    subject: str
    message_id: str | None
    refs: list[str]
    text: str
    date: float | None
    auto: bool
    media: list[InboundMedia] = field(default_factory=list)


def parse_mail(raw: bytes) -> ParsedMail:
    """Parse ``raw``. Raises ValueError when the mail has no usable From address."""
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(msg, EmailMessage)
    [(name, addr)] = getaddresses([str(msg.get("From", ""))])[:1] or [("", "")]
    if "@" not in addr:
        raise ValueError("no From address")
    refs: list[str] = []
    for header in ("References", "In-Reply-To"):
        for ref in _MSGID.findall(str(msg.get(header, ""))):
            if ref not in refs:
                refs.append(ref)
    [message_id] = _MSGID.findall(str(msg.get("Message-ID", "")))[:1] or [None]
    return ParsedMail(sender=canonical(addr), sender_name=name.strip() or None,
                      subject=str(msg.get("Subject", "")).strip(), message_id=message_id,
                      refs=refs, text=strip_quoted(body_text(msg)), date=_date(msg),
                      auto=is_automatic(msg, addr), media=attachments(msg))


def _date(msg: EmailMessage) -> float | None:
    try:
        return parsedate_to_datetime(str(msg["Date"])).timestamp() if msg["Date"] else None
    except (TypeError, ValueError):
        return None


def is_automatic(msg: EmailMessage, sender: str) -> bool:
    """RFC 3834 auto-submitted mail, a list or bulk mail, or a bounce."""
    auto = str(msg.get("Auto-Submitted", "no")).strip().lower()
    precedence = str(msg.get("Precedence", "")).strip().lower()
    local = sender.partition("@")[0].lower()
    return (auto not in ("", "no") or precedence in ("bulk", "list", "junk")
            or local in ("mailer-daemon", "postmaster") or msg.get("List-Id") is not None)


def body_text(msg: EmailMessage) -> str:
    """The plain-text body, else the HTML body as text, else ""."""
    part = msg.get_body(preferencelist=("plain", "html"))
    if part is None:
        return ""
    try:
        content = part.get_content()
    except (LookupError, ValueError):  # an unknown charset: decode what we can
        content = (part.get_payload(decode=True) or b"").decode("utf-8", "replace")
    if part.get_content_subtype() == "html":
        return html_text.extract_text(content, guess_layout=True).strip()
    return str(content).replace("\r\n", "\n").strip()


def strip_quoted(text: str) -> str:
    """``text`` without the trailing quoted history of a reply (module docstring)."""
    lines = text.split("\n")
    end = len(lines)
    while end > 0 and (lines[end - 1].startswith(">") or not lines[end - 1].strip()):
        end -= 1
    if end < len(lines) and end > 0 and _WROTE.match(lines[end - 1]):
        end -= 1
    kept = "\n".join(lines[:end]).rstrip()
    return kept if kept else text.strip()


def attachments(msg: EmailMessage) -> list[InboundMedia]:
    """Every attachment (or named inline part) as :class:`InboundMedia`, in order."""
    out = []
    for n, part in enumerate(msg.iter_attachments(), start=1):
        data = part.get_payload(decode=True)
        if not isinstance(data, bytes):
            continue  # an attached message/rfc822 without a file: skipped
        mime = part.get_content_type()
        kind = "image" if mime.startswith("image/") else "audio" if mime.startswith(
            "audio/") else "video" if mime.startswith("video/") else "document"
        name = part.get_filename() or f"attachment-{n}"
        out.append(InboundMedia(kind=kind, name=name, size=len(data), mime=mime,
                                fetch=_have(data, name)))
    return out


def _have(data: bytes, name: str):
    async def fetch(max_bytes: int) -> bytes:
        if len(data) > max_bytes:
            raise MediaTooLarge(name, len(data), max_bytes)
        return data
    return fetch
