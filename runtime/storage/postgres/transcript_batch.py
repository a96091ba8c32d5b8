"""The PostgreSQL transcript store's writer (runtime/storage/postgres/transcripts.py):
every durability point's lines, of every session, queued and committed by ONE background
task, everything that queued up meanwhile in ONE multi-row INSERT (as the timeline's
writer batches: the cost per turn falls as the load rises). One statement is atomic and
batches are written one after the other, so each session's lines land in call order.

A batch the primary key refuses (a stale writer: another replica appended to that session)
is retried item by item, so only the stale session's lines are dropped (its writer is
marked stale, ``transcript_write_conflict``). An outage is ridden out
(runtime/storage/postgres/retry.py) with a look-up first, so a commit the cut hid is never
written twice.

Replicas: a flush may carry its session's lane fence (``fence.py``); its rows are inserted
only while that lane lease is current, so a replica paused past the lease TTL adds no line
to the transcript the new owner writes (``transcript_write_fenced``, the writer is stale).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg
import structlog

from runtime.clock import Clock
from runtime.storage.postgres.fence import Fence, holds
from runtime.storage.postgres.retry import UNREACHABLE, RetryStats, ride_out

log = structlog.get_logger(__name__)

MAX_ITEMS = 256  # flushes per INSERT
_INSERT = ("INSERT INTO transcript_lines (agent_id, session_id, seq, entry_id, line) "
           "SELECT a, s, q, e, l FROM unnest($1::text[], $2::text[], $3::bigint[], "
           "$4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[]) AS u(a, s, q, e, "
           f"l, fn, fr, fg) WHERE u.fn IS NULL OR {holds('u.fn', 'u.fr', 'u.fg', lock=False)} "
           "RETURNING session_id")
_COUNT = ("SELECT count(*) FROM transcript_lines t JOIN unnest($1::text[], $2::text[], "
          "$3::bigint[]) AS u(a, s, q) ON t.agent_id = u.a AND t.session_id = u.s AND "
          "t.seq = u.q")

Item = tuple[Any, list[tuple[int, str | None, str]], asyncio.Future, Fence | None]


def _columns(items: list[Item]) -> list[list[Any]]:
    cols: list[list[Any]] = [[], [], [], [], [], [], [], []]
    for w, rows, _, fence in items:
        fn, fr, fg = fence or (None, None, None)
        for seq, entry_id, line in rows:
            for col, value in zip(cols, (w.agent_id, w.session_id, seq, entry_id, line,
                                         fn, fr, fg)):
                col.append(value)
    return cols


class LineBatcher:
    """``submit(writer, rows)`` queues; ``settled(session_id)`` / ``flush()`` wait."""

    def __init__(self, pool: asyncpg.Pool, clock: Clock, stats: RetryStats) -> None:
        self.pool, self.clock, self.stats = pool, clock, stats
        self.conflicts = self.failures = self.batches = self.fenced = 0
        self._queue: list[Item] = []
        self._last: dict[str, asyncio.Future] = {}  # session -> its latest flush
        self._task: asyncio.Task | None = None

    def submit(self, w: Any, rows: list[tuple[int, str | None, str]],
               fence: Fence | None = None) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.append((w, rows, fut, fence))
        self._last[w.session_id] = fut
        fut.add_done_callback(lambda f, sid=w.session_id: self._done(sid, f))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain())

    def _done(self, session_id: str, fut: asyncio.Future) -> None:
        if self._last.get(session_id) is fut:
            del self._last[session_id]

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:MAX_ITEMS], self._queue[MAX_ITEMS:]
            live = [it for it in batch if not self._dropped(it)]
            try:
                if live:
                    self.batches += 1
                    await self._write(live)
            except asyncpg.UniqueViolationError:
                for item in live:  # find the stale session(s); the others are written
                    if not self._dropped(item):
                        await self._write_one(item)
            except (asyncpg.PostgresError, *UNREACHABLE) as exc:
                for w, rows, _, _ in live:
                    self._fail(w, rows, exc)
            finally:
                for _, _, fut, _ in batch:
                    if not fut.done():
                        fut.set_result(None)

    def _dropped(self, item: Item) -> bool:
        w, rows, _, _ = item
        if w.stale:
            self.failures += 1
            log.error("transcript_write_dropped", session_id=w.session_id, lines=len(rows),
                      reason="an earlier write of this session failed")
        return bool(w.stale)

    async def _write(self, items: list[Item]) -> None:
        cols = _columns(items)

        async def attempt() -> list[str]:
            return [r[0] for r in await self.pool.fetch(_INSERT, *cols)]

        async def recovered() -> list[str] | None:  # a cut may have hidden the commit
            got = await self.pool.fetchval(_COUNT, cols[0], cols[1], cols[2])
            return cols[1] if got == len(cols[0]) else None
        written = await ride_out(attempt, what="transcript", stats=self.stats,
                                 clock=self.clock, recovered=recovered,
                                 sessions=len({c for c in cols[1]}))
        self._fenced(items, written)

    def _fenced(self, items: list[Item], written: list[str]) -> None:
        """Flushes whose lane fence PostgreSQL refused (none of their rows went in)."""
        count: dict[str, int] = {}
        for sid in written:
            count[sid] = count.get(sid, 0) + 1
        for w, rows, _, fence in items:
            if fence is None or w.stale:
                continue
            if count.get(w.session_id, 0) < sum(len(r) for x, r, _, _ in items if x is w):
                w.stale = True
                self.fenced += 1
                log.warning("transcript_write_fenced", session_id=w.session_id,
                            session_key=w.session_key, lease=fence[0], replica=fence[1],
                            generation=fence[2], lines=len(rows),
                            reason="another replica took this session's lane over")

    async def _write_one(self, item: Item) -> None:
        w, rows, _, _ = item
        try:
            await self._write([item])
        except asyncpg.UniqueViolationError:
            self.conflicts += 1
            w.stale = True
            log.error("transcript_write_conflict", session_id=w.session_id,
                      session_key=w.session_key, first_seq=rows[0][0], lines=len(rows),
                      reason="another writer appended to this session (its lane moved); "
                             "nothing was written, the session is reloaded")
        except (asyncpg.PostgresError, *UNREACHABLE) as exc:
            self._fail(w, rows, exc)

    def _fail(self, w: Any, rows: list, exc: BaseException) -> None:
        self.failures += 1
        w.stale = True
        log.error("transcript_write_failed", session_id=w.session_id, lines=len(rows),
                  error=f"{type(exc).__name__}: {exc}")

    async def settled(self, session_id: str) -> None:
        fut = self._last.get(session_id)
        if fut is not None:
            await asyncio.shield(fut)

    async def flush(self) -> None:
        """Wait for everything queued (shutdown)."""
        while self._task is not None and not self._task.done():
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._task)
