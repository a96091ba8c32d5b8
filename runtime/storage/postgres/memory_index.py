"""The memory vector index on PostgreSQL storage: :class:`PgVectorIndex`, the same
interface as the embedded ``runtime.memory.vectors.VectorIndex`` (``missing``, ``sync``,
``nearest``, ``stats``, ``backend``), over ``migrations/0016_memory_index.sql``.

Content-hashed as the embedded index: ``memory_vectors`` holds one vector per distinct
paragraph text of the agent, ``memory_chunks`` the current (hash, scope) pairs; a sync
stores only the vectors of new hashes and deletes the vectors no chunk uses. A change of
model or dimensions empties the agent's index (vectors of two spaces do not compare).

Ranking, said by :attr:`PgVectorIndex.backend`:

- **pgvector** installed in the database (``CREATE EXTENSION vector`` done by the
  operator): PostgreSQL ranks by cosine distance (``vector::vector <=> query``) and
  returns the nearest ``k``.
- otherwise the vectors are a ``real[]`` column: the gateway loads the agent's vectors
  once into a numpy matrix and ranks them exactly (cosine), reloading when ``rev`` moved
  (another replica or the CLI synced).

Blocking (through a :class:`~runtime.storage.postgres.bridge.SyncBridge`); callers run it
in a worker thread, as the embedded index. A deleted chunk's row is gone from every
query at once; PostgreSQL reclaims its bytes at the next VACUUM.

A stored vector of another size than the index's, or not finite, is skipped by the
rankings, kept in :attr:`PgVectorIndex.bad` (one ``memory_index_bad_vectors`` warning per
new set), returned by ``missing`` (the next sync embeds it again) and counted by
``stats``, as in the embedded index.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable
from typing import Any

import numpy as np
import structlog

log = structlog.get_logger(__name__)


def _stored(value: Any, dims: int | None) -> np.ndarray | None:
    """A stored ``real[]`` vector as float32, or None when it is unusable (not a flat
    list of numbers, another size than ``dims``, not finite)."""
    try:
        arr = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError):
        return None
    if arr.ndim != 1 or not len(arr) or (dims is not None and len(arr) != dims) \
            or not np.isfinite(arr).all():
        return None
    return arr


def _unit(vec: Any) -> np.ndarray:
    arr = np.asarray(vec, dtype=np.float32)
    norm = float(np.linalg.norm(arr))
    return arr / norm if norm > 0 else arr


class PgVectorIndex:
    """Vectors of one agent's memory paragraphs in PostgreSQL. ``bridge``: the process's
    SyncBridge; ``model`` names the embedding space. Thread-safe. The database is first
    asked on first use (from a worker thread, never the gateway's event loop)."""

    def __init__(self, bridge: Any, agent_id: str, model: str) -> None:
        self.bridge, self.agent_id, self.model = bridge, agent_id, model
        self._lock = threading.RLock()
        self._hashes: set[str] | None = None
        self._matrix: tuple[int, list[str], list[str], np.ndarray] | None = None
        self._opened = False
        self._pgvector: str | None = None
        self._dims: int | None = None
        self.bad: set[str] = set()  # hashes whose stored vector is unusable (skipped)
        self._warned_bad: frozenset[str] = frozenset()

    def _ensure(self) -> None:
        with self._lock:
            if not self._opened:
                self._pgvector = self.bridge.call(lambda c: c.fetchval(
                    "SELECT extversion FROM pg_extension WHERE extname = 'vector'"))
                self._dims = self.bridge.call(self._open)
                self._opened = True

    @property
    def pgvector(self) -> str | None:
        """pgvector's version in this database, or None (the column path)."""
        self._ensure()
        return self._pgvector

    @property
    def dims(self) -> int | None:
        self._ensure()
        return self._dims

    async def _open(self, c: Any) -> int | None:
        async with c.transaction():
            row = await c.fetchrow("SELECT model, dims FROM memory_index_meta "
                                   "WHERE agent_id = $1 FOR UPDATE", self.agent_id)
            if row is not None and row["model"] == self.model:
                return row["dims"]
            if row is not None:
                log.info("memory_index_model_changed", old=row["model"], new=self.model,
                         agent=self.agent_id)
            await self._reset(c)
            return None

    async def _reset(self, c: Any) -> None:
        a = self.agent_id
        await c.execute("DELETE FROM memory_chunks WHERE agent_id = $1", a)
        await c.execute("DELETE FROM memory_vectors WHERE agent_id = $1", a)
        await c.execute("INSERT INTO memory_index_meta (agent_id, model, dims, rev) "
                        "VALUES ($1, $2, NULL, 0) ON CONFLICT (agent_id) DO UPDATE SET "
                        "model = $2, dims = NULL, rev = memory_index_meta.rev + 1",
                        a, self.model)

    @property
    def backend(self) -> str:
        if self.pgvector:
            return f"PostgreSQL with pgvector {self.pgvector} (cosine, ranked in PostgreSQL)"
        return ("PostgreSQL real[] column, ranked by the gateway (exact cosine, numpy; "
                "pgvector is not installed in this database)")

    # -- sync ------------------------------------------------------------------------------
    def missing(self, hashes: Iterable[str]) -> list[str]:
        """The hashes among ``hashes`` that have no usable vector (to embed), in order."""
        with self._lock:
            if self._hashes is None:
                rows = self.bridge.call(lambda c: c.fetch(
                    "SELECT hash, vector FROM memory_vectors WHERE agent_id = $1",
                    self.agent_id))
                dims = self.dims
                self.bad = {r[0] for r in rows if _stored(r[1], dims) is None}
                self._warn_bad()
                self._hashes = {r[0] for r in rows} - self.bad
            have = self._hashes
        return list(dict.fromkeys(h for h in hashes if h not in have))

    def _warn_bad(self) -> None:
        """One warning per new set of unusable vectors."""
        if self.bad and frozenset(self.bad) != self._warned_bad:
            log.warning("memory_index_bad_vectors", agent=self.agent_id, count=len(self.bad),
                        hint="they are skipped; tidegate memory reindex embeds them again")
        self._warned_bad = frozenset(self.bad)

    def sync(self, new: dict[str, list[float]], chunks: Collection[tuple[str, str]]) -> int:
        """Store ``new`` vectors and make the chunk set exactly ``chunks`` ((hash, scope)
        pairs), in one transaction; returns how many chunk rows changed. Raises
        ValueError when a vector's dimensions differ from the index's."""
        vecs = {h: _unit(v) for h, v in new.items()}
        dims = {len(v) for v in vecs.values()}
        with self._lock:
            if len(dims) > 1 or (dims and self.dims is not None and self.dims not in dims):
                raise ValueError(f"embedding has {max(dims)} dimensions, the index "
                                 f"{self.dims}")
            try:
                changed = self.bridge.call(lambda c: self._sync(c, vecs, set(chunks)))
            finally:
                self._hashes = None
            if dims and self._dims is None:
                self._dims = dims.pop()
            if changed or vecs:
                self._matrix = None
            return changed

    async def _sync(self, c: Any, vecs: dict[str, np.ndarray],
                    want: set[tuple[str, str]]) -> int:
        a = self.agent_id
        async with c.transaction():
            await c.execute("SELECT 1 FROM memory_index_meta WHERE agent_id = $1 FOR UPDATE", a)
            if vecs:
                await c.executemany(
                    "INSERT INTO memory_vectors (agent_id, hash, vector) VALUES ($1, $2, $3) "
                    "ON CONFLICT (agent_id, hash) DO UPDATE SET vector = EXCLUDED.vector",
                    [(a, h, v.tolist()) for h, v in vecs.items()])
                await c.execute("UPDATE memory_index_meta SET dims = $2 WHERE agent_id = $1 "
                                "AND dims IS NULL", a, len(next(iter(vecs.values()))))
            have = {(r[0], r[1]) for r in await c.fetch(
                "SELECT hash, scope FROM memory_chunks WHERE agent_id = $1", a)}
            stored = {r[0] for r in await c.fetch(
                "SELECT hash FROM memory_vectors WHERE agent_id = $1", a)}
            gone = [p for p in have if p not in want]
            added = [p for p in want if p not in have and p[0] in stored]
            if gone:
                await c.executemany("DELETE FROM memory_chunks WHERE agent_id = $1 AND "
                                    "hash = $2 AND scope = $3", [(a, h, s) for h, s in gone])
            if added:
                await c.executemany("INSERT INTO memory_chunks (agent_id, hash, scope) "
                                    "VALUES ($1, $2, $3)", [(a, h, s) for h, s in added])
            used = {h for h, _ in want}
            await c.execute("DELETE FROM memory_vectors WHERE agent_id = $1 AND "
                            "NOT (hash = ANY($2::text[]))", a, list(used))
            await c.execute("UPDATE memory_index_meta SET rev = rev + 1 WHERE agent_id = $1", a)
            return len(gone) + len(added)

    # -- query -----------------------------------------------------------------------------
    def nearest(self, query: list[float], scopes: Collection[str] | None, k: int,
                allowed: Collection[str] | None = None) -> list[tuple[str, float]]:
        """(hash, cosine similarity) of the ``k`` nearest chunks in ``scopes`` (None: all),
        best first; ``allowed``: only these hashes (a time window)."""
        q = _unit(query)
        if self.dims is None or len(q) != self.dims:
            return []
        if self.pgvector:
            return self._ranked_in_postgres(q, scopes, k, allowed)
        with self._lock:
            _, hashes, names, matrix = self._loaded()
        if not hashes:
            return []
        sims = np.einsum("ij,j->i", matrix, q)
        keep = [(scopes is None or s in scopes) and (allowed is None or h in allowed)
                for h, s in zip(hashes, names, strict=True)]
        sims = np.where(keep, sims, -np.inf)
        out: dict[str, float] = {}
        for i in np.argsort(-sims).tolist():
            if sims[i] == -np.inf or len(out) >= k:
                break
            out.setdefault(hashes[i], float(sims[i]))
        return list(out.items())

    def _loaded(self) -> tuple[int, list[str], list[str], np.ndarray]:
        """The agent's chunks and their vectors, reloaded when ``rev`` moved."""
        rev = self.bridge.call(lambda c: c.fetchval(
            "SELECT rev FROM memory_index_meta WHERE agent_id = $1", self.agent_id))
        if self._matrix is None or self._matrix[0] != rev:
            rows = self.bridge.call(lambda c: c.fetch(
                "SELECT c.hash, c.scope, v.vector FROM memory_chunks c JOIN memory_vectors v"
                " USING (agent_id, hash) WHERE c.agent_id = $1", self.agent_id))
            dims = self.dims
            vecs = [_stored(r[2], dims) for r in rows]
            self.bad = {r[0] for r, v in zip(rows, vecs, strict=True) if v is None}
            self._warn_bad()
            good = [(r, v) for r, v in zip(rows, vecs, strict=True) if v is not None]
            matrix = np.stack([v for _, v in good]) if good else \
                np.zeros((0, dims or 0), dtype=np.float32)
            self._matrix = (rev, [r[0] for r, _ in good], [r[1] for r, _ in good], matrix)
        return self._matrix

    def _ranked_in_postgres(self, q: np.ndarray, scopes: Collection[str] | None, k: int,
                            allowed: Collection[str] | None) -> list[tuple[str, float]]:
        literal = "[" + ",".join(f"{x:.7g}" for x in q.tolist()) + "]"
        rows = self.bridge.call(lambda c: c.fetch(
            "SELECT c.hash, 1 - (v.vector::vector <=> $2::vector) AS sim "
            "FROM memory_chunks c JOIN memory_vectors v USING (agent_id, hash) "
            "WHERE c.agent_id = $1 AND ($3::text[] IS NULL OR c.scope = ANY($3)) "
            "AND cardinality(v.vector) = $6 AND NOT ('NaN'::real = ANY(v.vector)) "
            "AND ($4::text[] IS NULL OR c.hash = ANY($4)) "
            "ORDER BY v.vector::vector <=> $2::vector LIMIT $5",
            self.agent_id, literal, None if scopes is None else list(scopes),
            None if allowed is None else list(allowed), k * 2, len(q)))
        out: dict[str, float] = {}
        for h, sim in rows:
            out.setdefault(h, float(sim))
        return list(out.items())[:k]

    def stats(self) -> dict[str, Any]:
        """Counts and the backend, for ``tidegate memory status``."""
        a = self.agent_id

        async def counts(c: Any) -> tuple[int, int]:
            return (await c.fetchval("SELECT count(*) FROM memory_vectors WHERE agent_id = $1",
                                     a),
                    await c.fetchval("SELECT count(*) FROM memory_chunks WHERE agent_id = $1",
                                     a))
        n_vec, n_chunks = self.bridge.call(counts)
        with self._lock:
            self._hashes = None
            self.missing(())  # loads the stored vectors: counts the unusable ones
        return {"path": f"postgresql:memory_vectors/{a}", "model": self.model,
                "dimensions": self.dims, "vectors": n_vec, "chunks": n_chunks,
                "bad_vectors": len(self.bad), "backend": self.backend}

    def close(self) -> None:
        """Nothing to close: the bridge belongs to the gateway (or the CLI command)."""
