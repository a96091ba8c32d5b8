"""BM25 over the memory files: the keyword half of memory search (seed 002 time windows
and decay; runtime/memory/paragraphs.py for the units and their ``created_at``).

Relevance is BM25 (``bm25s``, Lucene variant, k1 = 1.5, b = 0.75) over the tokens of
:func:`runtime.memory.paragraphs.tokenize`. No stemming, no network. Sources: the agent
scope (``<workspace>/MEMORY.md`` and ``<workspace>/memory/*.md``) and, when a scopes
directory is given, the scoped entries (``<scopes>/user/<id>.md``, ``<scopes>/group/<id>.md``;
runtime/memory/scopes.py) and, with a transcript source, the agent's transcripts
(runtime/memory/transcripts.py). The index is cached and rebuilt only when a file is
added, removed or changes mtime/size, or a transcript grew.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Collection
from dataclasses import dataclass
from datetime import tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import structlog

from runtime.memory.paragraphs import (
    Hit,
    Paragraph,
    _daily_date,
    _local,
    parse_paragraphs,
    tokenize,
)
from runtime.memory.scopes import scope_files

if TYPE_CHECKING:  # bm25s pulls in numpy (~0.1 s): loaded on the first search only
    import bm25s

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Query:
    """One search's filters: epoch seconds (``created_after`` inclusive, ``created_before``
    exclusive), ``scopes`` the visible scopes (None: all), ``decay_lambda`` per hour."""

    now: float
    created_after: float | None = None
    created_before: float | None = None
    scopes: Collection[str] | None = None
    decay_lambda: float = 0.0

    def admits(self, para: Paragraph) -> bool:
        if self.scopes is not None and para.scope not in self.scopes:
            return False
        if self.created_after is not None and para.created_at < self.created_after:
            return False
        return self.created_before is None or para.created_at < self.created_before

    def decay(self, para: Paragraph) -> float:
        """exp(−λ·Δt_hours), Δt = now − created_at clamped at 0."""
        return math.exp(-self.decay_lambda * max(0.0, self.now - para.created_at) / 3600.0)


def check_query(query: str, limit: int, q: Query) -> list[str]:
    """The query's tokens. Raises ValueError for a query without searchable words,
    limit < 1, a negative λ or an empty window."""
    terms = tokenize(query or "")
    if not terms:
        raise ValueError(f"memory_search: query {query!r} has no searchable words")
    if limit < 1:
        raise ValueError(f"memory_search: limit must be >= 1, got {limit}")
    if q.decay_lambda < 0 or math.isnan(q.decay_lambda):
        raise ValueError(f"memory_search: decay_lambda must be >= 0, got {q.decay_lambda}")
    if q.created_after is not None and q.created_before is not None \
            and q.created_after >= q.created_before:
        raise ValueError("memory_search: created_after must be earlier than created_before")
    return terms


class MemoryIndex:
    """Cached BM25 index over the agent's memory files and (``scopes_dir``) scoped entries.

    ``tz`` (IANA name or tzinfo) is the user's timezone for dates in daily-note names and
    local stamps. :meth:`search` is blocking (file reads on a cache miss); use
    :meth:`asearch` from the event loop. Thread-safe.
    """

    def __init__(self, workspace: str | Path, *, tz: str | tzinfo = "UTC",
                 scopes_dir: str | Path | None = None, transcripts: Any = None) -> None:
        self.workspace = Path(workspace)
        self.scopes_dir = Path(scopes_dir) if scopes_dir is not None else None
        # runtime/memory/transcripts.py TranscriptSource (memory.index_transcripts)
        self.transcripts = transcripts
        self.tz = ZoneInfo(tz) if isinstance(tz, str) else tz
        self.builds = 0  # how many times the BM25 index was (re)built; tests watch it
        self._lock = threading.Lock()
        self._files: dict[str, tuple[int, int, list[Paragraph]]] = {}
        self._paragraphs: list[Paragraph] = []
        self._retriever: bm25s.BM25 | None = None

    def _memory_files(self) -> list[tuple[Path, str, str]]:
        """(path, path shown, scope) of every source file."""
        files = []
        for name in ("MEMORY.md", "memory.md"):
            p = self.workspace / name
            if p.is_file():
                files.append((p, name, "agent"))
                break
        mem = self.workspace / "memory"
        if mem.is_dir():
            files.extend((p, f"memory/{p.name}", "agent") for p in
                         sorted(p for p in mem.iterdir() if p.suffix == ".md" and p.is_file()))
        if self.scopes_dir is not None:
            files.extend(scope_files(self.scopes_dir))
        return files

    def _read(self, p: Path, rel: str, scope: str, st: Any) -> list[Paragraph] | None:
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            log.warning("memory_file_unreadable", path=rel, error=str(exc))
            return None
        day = _daily_date(p) if p.parent.name == "memory" else None
        default = _local(day, None, self.tz) if day else st.st_mtime
        paras = parse_paragraphs(text, rel, default, day=day, tz=self.tz)
        for para in paras:
            para.scope = scope
        return paras

    def _refresh(self) -> None:
        seen: dict[str, tuple[int, int, list[Paragraph]]] = {}
        changed = False
        for p, rel, scope in self._memory_files():
            try:
                st = p.stat()
            except FileNotFoundError:  # deleted between listing and stat
                continue
            cached = self._files.get(rel)
            if cached is not None and cached[:2] == (st.st_mtime_ns, st.st_size):
                seen[rel] = cached
                continue
            changed = True
            paras = self._read(p, rel, scope, st)
            if paras is not None:
                seen[rel] = (st.st_mtime_ns, st.st_size, paras)
        spoken: list[Paragraph] = []
        if self.transcripts is not None:
            moved, spoken = self.transcripts.refresh()
            changed = changed or moved
        if not changed and seen.keys() == self._files.keys():
            return
        self._files = seen
        self._paragraphs = [para for _, _, paras in seen.values() for para in paras] + spoken
        self._retriever = None
        corpus = [tokenize(f"{p.heading}\n{p.text}") for p in self._paragraphs]
        if any(corpus):  # bm25s cannot index a corpus without a single token
            import bm25s
            _quiet_bm25s()
            retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
            retriever.index(corpus, show_progress=False)
            self._retriever = retriever
        self.builds += 1
        log.debug("memory_index_built", files=len(seen), paragraphs=len(self._paragraphs))

    def paragraphs(self) -> list[Paragraph]:
        """Every current paragraph (files re-read where they changed). Blocking."""
        with self._lock:
            self._refresh()
            return self._paragraphs

    def ranked(self, terms: list[str], q: Query) -> list[tuple[Paragraph, float]]:
        """(paragraph, BM25 score > 0) admitted by ``q``, best first. Blocking."""
        with self._lock:
            self._refresh()
            paragraphs, retriever = self._paragraphs, self._retriever
        if retriever is None:
            return []
        ids = retriever.get_tokens_ids(terms)
        if not ids:
            return []
        scores = retriever.get_scores(ids)
        out = [(paragraphs[i], float(scores[i])) for i in scores.nonzero()[0].tolist()
               if scores[i] > 0.0 and q.admits(paragraphs[i])]
        out.sort(key=lambda ps: (-ps[1], -ps[0].created_at, ps[0].path, ps[0].line))
        return out

    def search(
        self,
        query: str,
        *,
        now: float,
        limit: int = 5,
        created_after: float | None = None,
        created_before: float | None = None,
        decay_lambda: float = 0.0,
        scopes: Collection[str] | None = None,
    ) -> list[Hit]:
        """Best ``limit`` paragraphs for ``query`` by BM25 × decay, highest score first.

        ``now``, ``created_after`` (inclusive) and ``created_before`` (exclusive) are epoch
        seconds; the window is applied before ranking. ``decay_lambda`` is per hour
        (Δt = now − created_at, clamped at 0). ``scopes``: only entries of these scopes
        (None: all). Paragraphs sharing no term with the query are never returned. Raises
        ValueError for a query without searchable words, limit < 1, a negative λ or an
        empty window.
        """
        q = Query(now, created_after, created_before, scopes, decay_lambda)
        terms = check_query(query, limit, q)
        hits = [Hit(p.text, p.path, p.line, p.created_at, rel * q.decay(p), rel, p.heading,
                    p.scope, p.entry_id if p.scope != "agent" else "")
                for p, rel in self.ranked(terms, q)]
        hits.sort(key=lambda h: (-h.score, -h.created_at, h.path, h.line))
        return hits[:limit]

    async def asearch(self, query: str, **kwargs: Any) -> list[Hit]:
        """:meth:`search` in a worker thread (same arguments)."""
        return await asyncio.to_thread(self.search, query, **kwargs)


def _quiet_bm25s() -> None:
    """bm25s sets its logger to DEBUG when imported (after the process configured its
    logging): bring it back to the root logger's level, at least WARNING, so its debug
    lines never reach the CLI's stderr or the gateway log."""
    import logging
    lib = logging.getLogger("bm25s")
    if lib.level < logging.WARNING:
        lib.setLevel(max(logging.WARNING, logging.getLogger().level))
