"""memory_search: keyword search over a workspace's memory files, with time windows and decay.

Seed 003 (memory layers: long-term ``MEMORY.md``, daily notes ``memory/YYYY-MM-DD.md``) and
seed 002 (time-window filters ``created_after``/``created_before``, exponential time decay
``exp(-λ·Δt_hours)``; λ = 0 no decay, 0.5 keeps ~60.7 % after 1 h, 1.0 ~36.8 %).

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

Relevance is BM25 (``bm25s``, Lucene variant, k1 = 1.5, b = 0.75) over lower-cased word
tokens minus English stop words; CJK text is indexed as single characters plus character
bigrams, so Chinese queries match without a segmenter. No stemming, no embeddings, no
network. The index is cached and rebuilt only when a file is added, removed or changes
mtime/size.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import threading
from dataclasses import dataclass
from datetime import date, datetime, tzinfo
from datetime import time as dtime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import structlog

from runtime.clock import parse_iso, utc_iso

if TYPE_CHECKING:  # bm25s pulls in numpy (~0.1 s): loaded on the first search only
    import bm25s

log = structlog.get_logger(__name__)

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
    relevance × exp(−λ·Δt_hours). ``heading`` is the heading context ("" at top level).
    """

    text: str
    path: str
    line: int
    created_at: float
    score: float
    relevance: float
    heading: str = ""


@dataclass(slots=True)
class _Paragraph:
    text: str
    heading: str
    path: str
    line: int
    created_at: float


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


class MemoryIndex:
    """Cached BM25 index over ``<workspace>/MEMORY.md`` and ``<workspace>/memory/*.md``.

    ``tz`` (IANA name or tzinfo) is the user's timezone for dates in daily-note names and
    local stamps. :meth:`search` is blocking (file reads on a cache miss); use
    :meth:`asearch` from the event loop. Thread-safe.
    """

    def __init__(self, workspace: str | Path, *, tz: str | tzinfo = "UTC") -> None:
        self.workspace = Path(workspace)
        self.tz = ZoneInfo(tz) if isinstance(tz, str) else tz
        self.builds = 0  # how many times the BM25 index was (re)built; tests watch it
        self._lock = threading.Lock()
        self._files: dict[str, tuple[int, int, list[_Paragraph]]] = {}
        self._paragraphs: list[_Paragraph] = []
        self._retriever: bm25s.BM25 | None = None

    def _memory_files(self) -> list[Path]:
        files = []
        for name in ("MEMORY.md", "memory.md"):
            p = self.workspace / name
            if p.is_file():
                files.append(p)
                break
        mem = self.workspace / "memory"
        if mem.is_dir():
            files.extend(sorted(p for p in mem.iterdir() if p.suffix == ".md" and p.is_file()))
        return files

    def _refresh(self) -> None:
        seen: dict[str, tuple[int, int, list[_Paragraph]]] = {}
        changed = False
        for p in self._memory_files():
            rel = p.relative_to(self.workspace).as_posix()
            try:
                st = p.stat()
            except FileNotFoundError:  # deleted between listing and stat
                continue
            cached = self._files.get(rel)
            if cached is not None and cached[:2] == (st.st_mtime_ns, st.st_size):
                seen[rel] = cached
                continue
            changed = True
            try:
                text = p.read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                log.warning("memory_file_unreadable", path=rel, error=str(exc))
                continue
            day = _daily_date(p) if p.parent.name == "memory" else None
            default = _local(day, None, self.tz) if day else st.st_mtime
            seen[rel] = (st.st_mtime_ns, st.st_size,
                         parse_paragraphs(text, rel, default, day=day, tz=self.tz))
        if not changed and seen.keys() == self._files.keys():
            return
        self._files = seen
        self._paragraphs = [para for _, _, paras in seen.values() for para in paras]
        self._retriever = None
        corpus = [tokenize(f"{p.heading}\n{p.text}") for p in self._paragraphs]
        if any(corpus):  # bm25s cannot index a corpus without a single token
            import bm25s
            retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
            retriever.index(corpus, show_progress=False)
            self._retriever = retriever
        self.builds += 1
        log.debug("memory_index_built", files=len(seen), paragraphs=len(self._paragraphs))

    def search(
        self,
        query: str,
        *,
        now: float,
        limit: int = 5,
        created_after: float | None = None,
        created_before: float | None = None,
        decay_lambda: float = 0.0,
    ) -> list[Hit]:
        """Best ``limit`` paragraphs for ``query``, highest score first.

        ``now``, ``created_after`` (inclusive) and ``created_before`` (exclusive) are epoch
        seconds; the window is applied before ranking. ``decay_lambda`` is per hour
        (Δt = now − created_at, clamped at 0). Paragraphs sharing no term with the query
        are never returned. Raises ValueError for a query without searchable words,
        limit < 1, a negative λ or an empty window.
        """
        terms = tokenize(query or "")
        if not terms:
            raise ValueError(f"memory_search: query {query!r} has no searchable words")
        if limit < 1:
            raise ValueError(f"memory_search: limit must be >= 1, got {limit}")
        if decay_lambda < 0 or math.isnan(decay_lambda):
            raise ValueError(f"memory_search: decay_lambda must be >= 0, got {decay_lambda}")
        if created_after is not None and created_before is not None \
                and created_after >= created_before:
            raise ValueError("memory_search: created_after must be earlier than created_before")
        with self._lock:
            self._refresh()
            paragraphs, retriever = self._paragraphs, self._retriever
        if retriever is None:
            return []
        ids = retriever.get_tokens_ids(terms)
        if not ids:
            return []
        scores = retriever.get_scores(ids)
        hits = []
        for i, para in enumerate(paragraphs):
            rel = float(scores[i])
            if rel <= 0.0:
                continue
            if created_after is not None and para.created_at < created_after:
                continue
            if created_before is not None and para.created_at >= created_before:
                continue
            age_h = max(0.0, now - para.created_at) / 3600.0
            hits.append(Hit(para.text, para.path, para.line, para.created_at,
                            rel * math.exp(-decay_lambda * age_h), rel, para.heading))
        hits.sort(key=lambda h: (-h.score, -h.created_at, h.path, h.line))
        return hits[:limit]

    async def asearch(self, query: str, **kwargs: Any) -> list[Hit]:
        """:meth:`search` in a worker thread (same arguments)."""
        return await asyncio.to_thread(self.search, query, **kwargs)



def _when(value: Any, name: str, zone: tzinfo) -> float | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise TypeError(f"memory_search: {name} must be a string (RFC 3339 or YYYY-MM-DD)")
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value.strip()):
            return _local(date.fromisoformat(value.strip()), None, zone)
        return parse_iso(value)
    except ValueError:
        raise ValueError(f"memory_search: {name} {value!r} is not RFC 3339 or YYYY-MM-DD") from None


async def run_memory_search_tool(index: MemoryIndex, arguments: dict[str, Any], *, now: float,
                                 decay_lambda: float = 0.0) -> str:
    """Execute a ``memory_search`` tool call (declared in runtime/tools/memory_tool.py); returns the JSON text handed to the model.

    Result: ``{"results": [{"path", "line", "heading", "created_at" (RFC 3339 UTC),
    "score", "text"}]}``. Raises ValueError for bad values and TypeError for wrong types
    (messages fit for the model).
    """
    limit = arguments.get("limit", 5)
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError("memory_search: limit must be an integer")
    hits = await index.asearch(
        str(arguments.get("query", "")), now=now, limit=min(limit, 20), decay_lambda=decay_lambda,
        created_after=_when(arguments.get("created_after"), "created_after", index.tz),
        created_before=_when(arguments.get("created_before"), "created_before", index.tz))
    return json.dumps({"results": [
        {"path": h.path, "line": h.line, "heading": h.heading, "created_at": utc_iso(h.created_at),
         "score": round(h.score, 4), "text": h.text} for h in hits]}, ensure_ascii=False)

