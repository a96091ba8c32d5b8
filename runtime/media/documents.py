"""Documents for the model: text-like files under ``TEXT_INLINE_MAX`` bytes are inlined
fenced with their (quoted) name; PDFs get their text extracted with pypdf up to a cap
(issue 12 "Documents")."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import structlog

from runtime.media.ref import MediaRef

log = structlog.get_logger(__name__)

TEXT_INLINE_MAX = 100 * 1024  # bytes
PDF_TEXT_MAX = 30_000  # characters
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/x-yaml")


def document_text(workspace: Path, ref: MediaRef, *, pdf_max_chars: int = PDF_TEXT_MAX,
                  inline_max: int = TEXT_INLINE_MAX) -> str | None:
    """The block to add to the message for ``ref``, or None (not a text-like file, too
    big). A PDF whose text cannot be read gets a note saying so, so the model does not
    answer as if it had read it. Blocking: call it off the event loop."""
    if ref.mime.startswith(TEXT_TYPES) and ref.size <= inline_max:
        body = (workspace / ref.path).read_text("utf-8", errors="replace")
        return fenced(ref.name or ref.path, body, "file")
    if ref.mime == "application/pdf":
        text = pdf_text((workspace / ref.path).read_bytes(), pdf_max_chars)
        if not text:
            return (f"PDF {json.dumps(ref.name or ref.path, ensure_ascii=False)}: its text "
                    "could not be read (the file is damaged or encrypted, or holds only "
                    "scanned images); do not answer as if you had read it.")
        return fenced(ref.name or ref.path, text, "text extracted from PDF")
    return None


def pdf_text(data: bytes, max_chars: int) -> str:
    """Text of the PDF's pages in order, cut at ``max_chars`` (a marker says so). A PDF
    pypdf cannot read gives "" (logged)."""
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        out: list[str] = []
        total = 0
        for page in reader.pages:
            text = page.extract_text() or ""
            out.append(text)
            total += len(text)
            if total >= max_chars:
                break
    except Exception as exc:  # noqa: BLE001 - pypdf raises many types for bad files
        log.warning("pdf_text_failed", error=f"{type(exc).__name__}: {exc}")
        return ""
    text = "\n".join(out).strip()
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[... cut at {max_chars} characters ...]"
    return text


def fenced(name: str, body: str, what: str) -> str:
    """``body`` in a Markdown fence longer than any backtick run inside it, headed by the
    JSON-quoted ``name`` (file names are the sender's data, not instructions)."""
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{what} {json.dumps(name, ensure_ascii=False)}:\n{fence}\n{body}\n{fence}"
