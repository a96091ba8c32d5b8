"""Hybrid memory search: BM25 and vector results fused by reciprocal rank, then the
seed-002 time decay (docs/memory.md gives the formula and its constants).

For a query q and an admitted paragraph p (visible scope, inside the time window)::

    rrf(p)   = Σ_lists 1 / (k + rank_list(p))     k = rrf_k (60); lists: BM25 top N and
                                                  vector top N (N = candidates, 50) of
                                                  cosine >= min_similarity;
                                                  a list p is not in adds nothing
    score(p) = rrf(p) × exp(−λ · Δt_hours)        λ = memory.time_decay_lambda

Without embeddings configured, or while the embeddings endpoint fails, the score is
BM25 × exp(−λ·Δt_hours) as before; a failure adds a ``note`` to the result, makes the
searches of the next :data:`RETRY_AFTER` seconds skip the endpoint, and logs one
warning per outage (``memory_embeddings_unavailable``; ``memory_embeddings_recovered`` when
it answers again).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from runtime.memory.embeddings import Embedder, EmbeddingError
from runtime.memory.keyword import MemoryIndex, Query, check_query
from runtime.memory.paragraphs import Hit, Paragraph
from runtime.memory.vectors import VectorIndex

log = structlog.get_logger(__name__)

FALLBACK_NOTE = ("semantic search is unavailable right now (embeddings endpoint failed); "
                 "these results are keyword matches only")
RETRY_AFTER = 30.0
"""Seconds after a failed embeddings call during which searches go straight to BM25
(an endpoint that times out would otherwise cost every search the full timeout)."""
CORRUPT_NOTE = ("semantic search is unavailable (the vector index is damaged; the operator "
                "can rebuild it with `tidegate memory reindex`); these results are keyword "
                "matches only")


@dataclass
class SearchResult:
    """``hits`` best first; ``mode`` ``hybrid`` | ``bm25``; ``note`` set on a fallback."""

    hits: list[Hit]
    mode: str
    note: str = ""


@dataclass
class HybridSearch:
    """Keyword index + (optional) vector index and embedder of one agent.

    ``embedder``/``vectors`` None: BM25 only. ``rrf_k`` and ``candidates`` per the module
    docstring."""

    keyword: MemoryIndex
    embedder: Embedder | None = None
    vectors: VectorIndex | None = None
    rrf_k: int = 60
    candidates: int = 50
    min_similarity: float = -1.0  # cosine below which a paragraph is left out of the vector list
    down: bool = False  # in an outage (one warning per outage)
    clock: Callable[[], float] = time.monotonic  # seconds; tests inject their own
    cooldown: float = RETRY_AFTER  # after a failed call, searches skip the endpoint
    _retry_at: float = 0.0
    corrupt: str = ""  # why the vector index is disabled ("<path>: <error>"), else ""
    embedded: int = 0  # paragraphs embedded since start (reindex/status report it)
    last_error: str = ""  # the last failed embeddings call's error (the CLI prints it)
    scrub: Callable[[str], str] | None = None  # applied to every text sent to be embedded
    # opens the index file again (the hub's); with it a disabled index is reopened once
    # the file at its path was replaced (``tidegate memory reindex`` rebuilt it)
    reopen: Callable[[], Any] | None = None
    _corrupt_at: Any = None  # (path, inode) of the file found damaged
    _synced: Any = None
    _sync_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _queries: OrderedDict = field(default_factory=OrderedDict)
    _by_hash: tuple[Any, dict[str, list[Paragraph]]] = (None, {})

    @property
    def semantic(self) -> bool:
        return self.embedder is not None and self.vectors is not None

    async def sync(self, *, force: bool = False, reembed: bool = False) -> dict[str, int]:
        """Embed new/changed paragraphs (and those whose stored vector is unusable; every
        paragraph when ``reembed``) and update the vector index. ``force``: even when the
        memory files did not change since the last sync. Returns ``{"paragraphs",
        "embedded", "chunks_changed"}``. Raises EmbeddingError."""
        assert self.embedder is not None and self.vectors is not None
        async with self._sync_lock:
            paras = await asyncio.to_thread(self.keyword.paragraphs)
            if paras is self._synced and not (force or reembed):
                return {"paragraphs": len(paras), "embedded": 0, "chunks_changed": 0}
            by_hash = {p.digest: p for p in paras}
            todo = list(by_hash) if reembed else \
                await asyncio.to_thread(self.vectors.missing, by_hash)
            vecs = await self.embedder.embed([self._sent(_embed_text(by_hash[h]))
                                              for h in todo]) if todo else []
            self._check_dims(vecs)
            changed = await asyncio.to_thread(
                self.vectors.sync, dict(zip(todo, vecs, strict=True)),
                {(p.digest, p.scope) for p in paras})
            self._synced = paras
            self.embedded += len(todo)
            if todo or changed:
                log.info("memory_index_synced", embedded=len(todo), chunks_changed=changed,
                         paragraphs=len(paras))
            return {"paragraphs": len(paras), "embedded": len(todo), "chunks_changed": changed}

    def disable(self, exc: BaseException, path: Any = None) -> None:
        """Turn the vector half off after the index file (``path``, default the open
        index's) failed as a database: one warning naming the file; searches go on with
        BM25 and :data:`CORRUPT_NOTE`."""
        path = path if path is not None else getattr(self.vectors, "path", "")
        self.corrupt = f"{path}: {exc}"
        self._corrupt_at = (path, _inode(path))
        log.warning("memory_index_corrupt", path=str(path), error=str(exc),
                    hint="searches use BM25 only; tidegate memory reindex rebuilds it")
        if self.vectors is not None:
            with contextlib.suppress(Exception):
                self.vectors.close()
        self.vectors = None

    async def prune(self) -> None:
        """Drop vectors of paragraphs that no longer exist, without embedding anything
        (after a deletion; works while the endpoint is down)."""
        if self.vectors is None:
            return
        paras = await asyncio.to_thread(self.keyword.paragraphs)
        try:
            await asyncio.to_thread(self.vectors.sync, {},
                                    {(p.digest, p.scope) for p in paras})
        except sqlite3.DatabaseError as exc:
            self.disable(exc)
        self._synced = None

    def _try_reopen(self) -> None:
        """After :meth:`disable`: open the index again when the file at its path is no
        longer the damaged one (rebuilt by ``tidegate memory reindex``). One stat per
        search while disabled; a new file that is damaged too stays disabled (and
        warned about once)."""
        if self.reopen is None or self._corrupt_at is None or self.embedder is None:
            return
        path, ino = self._corrupt_at
        now = _inode(path)
        if now is None or now == ino:
            return  # not rebuilt yet
        try:
            vectors = self.reopen()
        except sqlite3.DatabaseError as exc:
            self.disable(exc, path)
            return
        if self._corrupt_at is None:  # a concurrent search reopened it first
            vectors.close()
            return
        log.info("memory_index_reopened", path=str(path),
                 reason="the damaged file was replaced (tidegate memory reindex)")
        self.vectors, self.corrupt, self._corrupt_at = vectors, "", None
        self._synced = None

    def _sent(self, text: str) -> str:
        """``text`` as the embeddings endpoint gets it (configured secrets redacted)."""
        return self.scrub(text) if self.scrub is not None else text

    def _check_dims(self, vecs: list[list[float]]) -> None:
        """Raise EmbeddingError (an outage: BM25, the note, the cooldown) when a vector's
        size is not the configured ``dimensions``, or the index's (many local servers
        ignore ``dimensions``, or the model behind a name changed)."""
        assert self.embedder is not None
        want = self.embedder.dimensions or (self.vectors.dims if self.vectors else None)
        for vec in vecs:
            if want and len(vec) != want:
                raise EmbeddingError(
                    f"the embeddings endpoint returned vectors of {len(vec)} dimensions, "
                    f"expected {want} (memory.embeddings.dimensions or the index's; "
                    "set it to what the model returns)")
            if not all(math.isfinite(x) for x in vec):  # NaN/inf would be kept for good
                raise EmbeddingError("the embeddings endpoint returned a vector with "
                                     "non-finite values (NaN or infinity)")

    async def _query_vector(self, text: str) -> list[float]:
        vec = self._queries.get(text)
        if vec is None:
            assert self.embedder is not None
            [vec] = await self.embedder.embed([self._sent(text)])
            self._check_dims([vec])
            self._queries[text] = vec
            if len(self._queries) > 256:
                self._queries.popitem(last=False)
        return vec

    async def search(self, query: str, q: Query, limit: int = 5) -> SearchResult:
        """Best ``limit`` hits for ``query`` under ``q`` (see the module docstring).
        Raises ValueError for bad arguments (check_query)."""
        terms = check_query(query, limit, q)
        if self.corrupt:
            await asyncio.to_thread(self._try_reopen)
        if not self.semantic:
            ranked = await asyncio.to_thread(self.keyword.ranked, terms, q)
            return SearchResult(_bm25_hits(ranked, q, limit), "bm25",
                                CORRUPT_NOTE if self.corrupt else "")
        if self.down and self.clock() < self._retry_at:  # failed just now: do not wait
            ranked = await asyncio.to_thread(self.keyword.ranked, terms, q)  # on it again
            return SearchResult(_bm25_hits(ranked, q, limit), "bm25", FALLBACK_NOTE)
        try:
            qvec = await self._query_vector(query)
            # one worker hop in the steady state: BM25 and the vectors together
            found = await asyncio.to_thread(self._local, terms, q, qvec)
            if found is None:  # the memory files changed since the last sync
                await self.sync()
                found = await asyncio.to_thread(self._local, terms, q, qvec, True)
        except sqlite3.DatabaseError as exc:  # a damaged index.sqlite: disable it only
            self.disable(exc)
            return await self.search(query, q, limit)
        except EmbeddingError as exc:
            self.last_error = str(exc)
            if not self.down:
                log.warning("memory_embeddings_unavailable", error=str(exc),
                            retry_after=self.cooldown)
            self.down = True
            self._retry_at = self.clock() + self.cooldown
            ranked = await asyncio.to_thread(self.keyword.ranked, terms, q)
            return SearchResult(_bm25_hits(ranked, q, limit), "bm25", FALLBACK_NOTE)
        if self.down:
            log.info("memory_embeddings_recovered")
            self.down = False
        assert found is not None
        return SearchResult(self._fuse(found[0], found[1], q, limit), "hybrid")

    def _local(self, terms: list[str], q: Query, qvec: list[float], synced: bool = False
               ) -> tuple[list[tuple[Paragraph, float]], list[tuple[Paragraph, float]]] | None:
        """(BM25 ranking, vector ranking), or None when the index needs a sync first."""
        if not synced and self.keyword.paragraphs() is not self._synced:
            return None
        return self.keyword.ranked(terms, q), self._nearest(qvec, q)

    def _nearest(self, qvec: list[float], q: Query) -> list[tuple[Paragraph, float]]:
        assert self.vectors is not None
        paras = self.keyword.paragraphs()
        if self._by_hash[0] is not paras:  # once per snapshot of the memory files
            index: dict[str, list[Paragraph]] = {}
            for p in paras:
                index.setdefault(p.digest, []).append(p)
            self._by_hash = (paras, index)
        by_hash = self._by_hash[1]
        window = q.created_after is not None or q.created_before is not None
        allowed = {p.digest for p in paras if q.admits(p)} if window else None
        hits = self.vectors.nearest(qvec, q.scopes, self.candidates, allowed=allowed)
        return [(p, sim) for h, sim in hits if sim >= self.min_similarity
                for p in by_hash.get(h, ()) if q.admits(p)][:self.candidates]

    def _fuse(self, ranked: list[tuple[Paragraph, float]],
              nearest: list[tuple[Paragraph, float]], q: Query, limit: int) -> list[Hit]:
        parts: dict[int, dict[str, Any]] = {}
        paras: dict[int, Paragraph] = {}
        for name, rows in (("bm25", ranked[:self.candidates]), ("vector", nearest)):
            for rank, (p, value) in enumerate(rows, start=1):
                d = parts.setdefault(id(p), {"bm25": None, "bm25_rank": None,
                                             "vector": None, "vector_rank": None})
                paras[id(p)] = p
                d[name], d[f"{name}_rank"] = round(value, 4), rank
        hits = []
        for key, d in parts.items():
            p = paras[key]
            rrf = sum(1.0 / (self.rrf_k + d[f"{n}_rank"]) for n in ("bm25", "vector")
                      if d[f"{n}_rank"] is not None)
            decay = q.decay(p)
            d.update(rrf=round(rrf, 6), decay=round(decay, 6))
            hits.append(Hit(p.text, p.path, p.line, p.created_at, rrf * decay,
                            d["bm25"] or 0.0, p.heading, p.scope,
                            p.entry_id if p.scope != "agent" else "", d))
        hits.sort(key=lambda h: (-h.score, -h.created_at, h.path, h.line))
        return hits[:limit]

    async def close(self) -> None:
        if self.embedder is not None:
            await self.embedder.close()
        if self.vectors is not None:
            self.vectors.close()


def _inode(path: Any) -> int | None:
    try:
        return os.stat(path).st_ino
    except (OSError, TypeError, ValueError):
        return None


def _embed_text(p: Paragraph) -> str:
    return f"{p.heading}\n{p.text}" if p.heading else p.text


def _bm25_hits(ranked: list[tuple[Paragraph, float]], q: Query, limit: int) -> list[Hit]:
    hits = []
    for rank, (p, rel) in enumerate(ranked, start=1):
        decay = q.decay(p)
        hits.append(Hit(p.text, p.path, p.line, p.created_at, rel * decay, rel, p.heading,
                        p.scope, p.entry_id if p.scope != "agent" else "",
                        {"bm25": round(rel, 4), "bm25_rank": rank, "decay": round(decay, 6)}))
    hits.sort(key=lambda h: (-h.score, -h.created_at, h.path, h.line))
    return hits[:limit]
