"""Model Markdown -> ready-to-send message parts for one platform.

``render_chunks`` splits the Markdown to the platform limit (channels/outbound/chunking.py), converts
each part (channels/outbound/markup.py) and re-splits any part whose converted form grew past the
limit (escaping ``&`` -> ``&amp;`` and tags make text longer). Every part carries a plain
text twin for the fallback when the platform rejects the markup (channels/outbound/delivery.py).

Splitting measures the Markdown with a cheap, slightly pessimistic estimate of the converted
length (raw length plus escape and tag growth counted with ``str.count``), so parts come
out close to the limit without converting every candidate; the exact check after conversion
catches the rare under-estimate.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from channels.outbound.chunking import (
    DISCORD_LIMIT,
    SLACK_LIMIT,
    TELEGRAM_LIMIT,
    split_text,
    utf16_len,
)
from channels.outbound.markup import convert_with_plain

PLAIN_LIMIT = 4000
WHATSAPP_LIMIT = 4096  # characters of the Cloud API's text.body
# Matrix caps a whole event at 65536 bytes of JSON and clients read long events badly:
# 4000 characters a part, and at most 16000 bytes of escaped JSON (a \\uXXXX pair for an
# emoji is 12 bytes) for each of body and formatted_body (matrix_length).
MATRIX_LIMIT = 4000


@dataclass(frozen=True, slots=True)
class RenderedChunk:
    """One message part: ``formatted`` in the platform's markup, ``plain`` the same content
    as plain text. Both fit the platform limit. ``source`` is the part's Markdown (fenced code
    closed/reopened), so unsent parts can be queued again as text (channels/outbound/outbox.py)."""

    formatted: str
    plain: str
    source: str = ""


@dataclass(frozen=True, slots=True)
class _Platform:
    name: str
    limit: int
    length: Callable[[str], int]  # how the platform counts a message
    estimate: Callable[[str], int]  # converted length predicted from the Markdown


def _tg_estimate(s: str) -> int:
    # & -> &amp; (+4), < > -> &lt; &gt; (+3), **x** -> <b>x</b> (+3 per pair), *x* -> <i>x</i>
    # (+5 per pair), `x` -> <code>x</code> (+11 per pair), ```lang -> <pre><code class=...>,
    # [t](u) -> <a href="u">t</a> (+11), # Heading -> <b>Heading</b>.
    doubled = s.count("**") + s.count("__") + s.count("~~")
    marks = s.count("*") + s.count("_") + s.count("~") - 2 * doubled
    return (utf16_len(s) + 4 * s.count("&") + 3 * (s.count("<") + s.count(">"))
            + 2 * doubled + 3 * marks + 6 * s.count("`")
            + 12 * s.count("](") + 5 * s.count("#") + 24 * s.count("\n>"))


def _slack_estimate(s: str) -> int:
    return len(s) + 4 * s.count("&") + 3 * (s.count("<") + s.count(">"))


def matrix_length(s: str) -> int:
    """How a Matrix part is measured against MATRIX_LIMIT: its characters, or a quarter
    of its escaped JSON bytes when that is more (non-ASCII text)."""
    return max(len(s), (len(json.dumps(s)) - 2) // 4)


def _matrix_estimate(s: str) -> int:
    # HTML tags and &escapes roughly double the markup characters
    return matrix_length(s) + 9 * (s.count("*") + s.count("`") + s.count("_") + s.count("\n")
                               + s.count("#") + s.count("](")) + 4 * s.count("&") + \
        4 * (s.count("<") + s.count(">")) + 2 * s.count('"')


def _discord_estimate(s: str) -> int:
    return utf16_len(s) + s.count("@everyone") + s.count("@here")


# Telegram counts UTF-16 code units. Discord's 2000 is counted conservatively the same way
# (never shorter than code points). Telegram measures its limit after entity parsing; we
# measure the HTML, which is stricter and so always safe.
PLATFORMS: dict[str, _Platform] = {
    "telegram": _Platform("telegram", TELEGRAM_LIMIT, utf16_len, _tg_estimate),
    "slack": _Platform("slack", SLACK_LIMIT, len, _slack_estimate),
    "discord": _Platform("discord", DISCORD_LIMIT, utf16_len, _discord_estimate),
    "whatsapp": _Platform("whatsapp", WHATSAPP_LIMIT, len, lambda s: len(s) + s.count("`")),
    "matrix": _Platform("matrix", MATRIX_LIMIT, matrix_length, _matrix_estimate),
    "plain": _Platform("plain", PLAIN_LIMIT, len, len),
}


def render_chunks(text: str, platform: str, *, limit: int | None = None) -> list[RenderedChunk]:
    """Split and convert model Markdown ``text`` for ``platform``.

    ``platform`` is one of "telegram", "slack", "discord", "whatsapp", "matrix", "plain";
    ``limit`` overrides the platform's message limit (Telegram 4096 and Discord 2000 UTF-16
    units, WhatsApp 4096, Slack and plain 4000 characters, Matrix 4000 by
    :func:`matrix_length`). Returns [] for empty/whitespace text; parts whose conversion is empty
    are dropped. Raises ValueError for an unknown platform or a limit < 1.
    """
    try:
        p = PLATFORMS[platform]
    except KeyError:
        raise ValueError(f"unknown platform {platform!r}; expected one of "
                         f"{sorted(PLATFORMS)}") from None
    lim = p.limit if limit is None else limit
    if lim < 1:
        raise ValueError(f"limit must be >= 1, got {lim}")
    out: list[RenderedChunk] = []
    for md in split_text(text, lim, length=p.estimate):
        out.extend(_fit(md, p, lim))
    return out


def _fit(md: str, p: _Platform, limit: int) -> list[RenderedChunk]:
    """Convert one Markdown chunk; re-split it smaller until both forms fit."""
    formatted, plain = convert_with_plain(md, p.name)
    if not formatted.strip() and not plain.strip():
        return []
    grown = max(p.length(formatted), p.length(plain))
    if grown <= limit:
        return [RenderedChunk(formatted or plain, plain or formatted, md)]
    size = p.length(md)
    # Shrink in proportion to the growth, with a margin; always strictly smaller.
    smaller = min(size - 1, int(size * limit / grown * 0.95))
    if smaller < 1:
        # One character that converts to more than the limit: nothing smaller exists.
        raise ValueError(f"limit {limit} is too small for {md!r} on {p.name}")
    out: list[RenderedChunk] = []
    for part in split_text(md, smaller, length=p.length):
        out.extend(_fit(part, p, limit))
    return out
