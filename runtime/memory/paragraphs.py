"""Memory text as search units: paragraphs with heading context, line and ``created_at``.

Seed 003 (memory layers: long-term ``MEMORY.md``, daily notes ``memory/YYYY-MM-DD.md``).
Units of search: paragraphs, i.e. blocks separated by blank lines (a fenced code block
stays whole). A markdown heading is not a paragraph; it becomes the context of the
paragraphs under it (``heading`` = ``"Projects > tidegate"``) and is indexed with them.

``created_at`` of a paragraph (epoch seconds), first match wins:

1. a stamp in the paragraph: ``<!-- ts: 2026-01-02T10:00:00+08:00 -->`` anywhere (RFC 3339;
   without an offset it is local time in the index's tz; the comment is not shown), or a
   leading ``[2026-01-02 10:00]`` / ``[2026-01-02 10:00:30]`` (local time), or in a daily
   note a leading ``[10:00]`` (that note's date);
2. a daily note's date from its file name, 00:00 local time;
3. otherwise (``MEMORY.md``, other ``memory/*.md``) the file's mtime.

Tokens (for BM25): lower-cased words minus English stop words; CJK text as single
characters plus character bigrams, so Chinese queries match without a segmenter.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from datetime import date, datetime, tzinfo
from datetime import time as dtime
from pathlib import Path
from zoneinfo import ZoneInfo

UTC = ZoneInfo("UTC")

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_DAILY = re.compile(r"^(\d{4})-(\d{2})-(\d{2})\.md$")
_TS_COMMENT = re.compile(r"<!--\s*ts:\s*(\S+?)\s*-->")
_TS_FULL = re.compile(r"^\s*(?:[-*]\s+)?\[(\d{4}-\d{2}-\d{2})[ T](\d{1,2}:\d{2}(?::\d{2})?)\]")
_TS_CLOCK = re.compile(r"^\s*(?:[-*]\s+)?\[(\d{1,2}:\d{2}(?::\d{2})?)\]")


@functools.cache
def _token_re() -> re.Pattern[str]:
    # Compiled on first search: the Unicode \W class costs ~5 ms, at every start otherwise.
    return re.compile(rf"([{_CJK}]+)|([^\W_{_CJK}]+)")


@functools.cache
def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN
    return frozenset(STOPWORDS_EN)


def tokenize(text: str) -> list[str]:
    """Lower-cased search tokens: words minus English stop words; CJK as chars + bigrams."""
    out: list[str] = []
    stop = _stopwords()
    for cjk, word in _token_re().findall(text.lower()):
        if cjk:
            out.extend(cjk)
            out.extend(cjk[i:i + 2] for i in range(len(cjk) - 1))
        elif word not in stop:
            out.append(word)
    return out


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result.

    ``path`` is relative to the workspace, ``line`` 1-based (the paragraph's first line),
    ``created_at`` epoch seconds, ``relevance`` the BM25 score and ``score`` =
    relevance × exp(−λ·Δt_hours) (hybrid search: RRF × decay, runtime/memory/search.py).
    ``heading`` is the heading context ("" at top level); ``scope`` whose entry it is;
    ``parts`` the score's parts (hybrid search) or None.
    """

    text: str
    path: str
    line: int
    created_at: float
    score: float
    relevance: float
    heading: str = ""
    scope: str = "agent"
    entry_id: str = ""
    parts: dict | None = None


@dataclass(slots=True)
class Paragraph:
    """One search unit. ``path`` relative to the workspace (or ``scopes/...`` for a scoped
    entry), ``line`` 1-based, ``created_at`` epoch seconds, ``scope`` ``agent`` |
    ``user:<id>`` | ``group:<id>``."""

    text: str
    heading: str
    path: str
    line: int
    created_at: float
    scope: str = "agent"
    _digest: str = ""

    @property
    def digest(self) -> str:
        """SHA-256 hex of heading + text: what the embedding cache is keyed by."""
        if not self._digest:
            self._digest = hashlib.sha256(f"{self.heading}\n{self.text}".encode()).hexdigest()
        return self._digest

    @property
    def entry_id(self) -> str:
        """A short stable id (10 hex) of a scoped entry: its text and time."""
        return hashlib.sha256(f"{self.created_at:.0f}\n{self.text}".encode()).hexdigest()[:10]


_Paragraph = Paragraph


def _local(day: date, clock: str | None, zone: tzinfo) -> float:
    """Epoch seconds of ``day`` at ``clock`` ("H:MM" or "H:MM:SS", None = 00:00) in ``zone``.

    Raises ValueError for an impossible time."""
    t = dtime(*(int(x) for x in clock.split(":"))) if clock else dtime()
    return datetime.combine(day, t, tzinfo=zone).timestamp()


def _stamp(text: str, day: date | None, zone: tzinfo) -> tuple[float | None, str]:
    """(created_at from a stamp or None, text without a ts comment)."""
    m = _TS_COMMENT.search(text)
    if m:
        stripped = (text[:m.start()] + text[m.end():]).strip()
        try:
            dt = datetime.fromisoformat(m.group(1))
        except ValueError:
            return None, stripped
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=zone)
        return dt.timestamp(), stripped
    m = _TS_FULL.match(text)
    if m:
        try:
            return _local(date.fromisoformat(m.group(1)), m.group(2), zone), text
        except ValueError:
            return None, text
    m = _TS_CLOCK.match(text)
    if m and day is not None:
        try:
            return _local(day, m.group(1), zone), text
        except ValueError:
            return None, text
    return None, text


def entry_text(text: str) -> str:
    """``text`` made safe to append as exactly one paragraph (one ``memory_write`` = one
    entry): blank lines dropped (they would end it), a line that would open a heading or
    a code fence escaped with ``\\``, and ``<!--`` written ``&lt;!--`` so no stamp
    comment can be forged. Single line breaks stay."""
    lines = []
    for line in text.strip().splitlines():
        if not line.strip():
            continue
        if _HEADING.match(line) or _FENCE.match(line):
            line = "\\" + line.lstrip()
        lines.append(line)
    return "\n".join(lines).replace("<!--", "&lt;!--")


def parse_paragraphs(text: str, path: str, default_created_at: float, *,
                     day: date | None = None, tz: tzinfo = UTC) -> list[_Paragraph]:
    """Split markdown into paragraphs with heading context, line numbers and created_at.

    ``day`` is a daily note's date (enables ``[HH:MM]`` stamps).
    """
    out: list[_Paragraph] = []
    stack: list[tuple[int, str]] = []
    lines: list[str] = []
    start = 0
    fence: str | None = None

    def flush() -> None:
        nonlocal lines
        if lines:
            body = "\n".join(lines).strip()
            created, body = _stamp(body, day, tz)
            if body:
                out.append(_Paragraph(body, " > ".join(t for _, t in stack), path, start,
                                      created if created is not None else default_created_at))
        lines = []

    for n, line in enumerate(text.splitlines(), start=1):
        if fence is not None:
            lines.append(line)
            if line.strip().startswith(fence):
                fence = None
            continue
        m = _FENCE.match(line)
        if m:
            fence = m.group(1)[:3]
        elif not line.strip():
            flush()
            continue
        elif (h := _HEADING.match(line)) is not None:
            flush()
            level = len(h.group(1))
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, h.group(2)))
            continue
        if not lines:
            start = n
        lines.append(line)
    flush()
    return out


def _daily_date(path: Path) -> date | None:
    m = _DAILY.match(path.name)
    try:
        return date(int(m[1]), int(m[2]), int(m[3])) if m else None
    except ValueError:  # 2026-13-45.md: not a date, treat like any other note
        return None
