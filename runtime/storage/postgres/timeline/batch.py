"""Group commit of the PostgreSQL timeline (issue 15 "Timeline on PostgreSQL"): every
``append_many`` of every session queues here, and ONE background task writes everything
that queued meanwhile in ONE transaction — usually one statement, one round trip, on a
connection it keeps while there is work (no pool acquire/release per append; asyncpg's
release resets the connection, a round trip of its own).

A round: the heads this process does not know yet are read (one SELECT for all of them),
each session's requests are chained in call order from its head (``chain.py``), then
``_BATCH`` moves every head *only where it still is what the chain was computed from*
(``last_seq`` and ``last_hash`` compared in the UPDATE, which row-locks it) and inserts
the events of exactly the sessions whose head moved — so seq and ``prev_hash`` are fixed
in the transaction that inserts the events, as under ``SELECT ... FOR UPDATE``. New
timelines get their row first and SESSION_END archives after the events (the insert
trigger wants the row there and active), in the same transaction.

A session whose head moved meanwhile (another replica appended, created or archived it)
is not written: its requests go back to the front of the queue, its head is read again
and the chain recomputed (after ``MAX_TRIES`` the store's locked path takes it). An
outage is ridden out (``retry.py``), a commit the cut hid looked up by its event ids
before it is tried again; a statement the database refuses (a trigger, a duplicate event
id) sends each request of the round through the store's locked path alone, so only the
guilty ones fail.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import structlog

from runtime.storage.postgres.fence import Fence, holds
from runtime.storage.postgres.retry import OUTAGE_RETRY, UNREACHABLE, ride_out
from runtime.storage.postgres.timeline.chain import EVENTS_SQL, Head, Item, chain
from runtime.timeline.model import TimelineError

log = structlog.get_logger(__name__)

MAX_REQUESTS = 512  # append_many calls per round
MAX_TRIES = 5  # rounds a request may lose to a moving head before the locked path
LINGER_S = 1.0  # an idle batcher keeps its connection this long

_HEADS = ("SELECT session_id, last_seq, last_hash, last_timestamp, status FROM timelines "
          "WHERE session_id = ANY($1::text[])")
_CREATE = ("INSERT INTO timelines (session_id, session_key, status, created_at, ended_at, "
           "last_seq, last_hash, last_timestamp) SELECT s, k, 'active', c, NULL, q, h, t "
           "FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], "
           "$6::bigint[], $7::text[], $8::text[], $9::bigint[]) AS u(s, k, c, q, h, t, fn, "
           f"fr, fg) WHERE u.fn IS NULL OR {holds('u.fn', 'u.fr', 'u.fg', lock=False)} "
           "ON CONFLICT (session_id) DO NOTHING RETURNING session_id")
_BATCH = (
    "WITH b AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], "
    "$5::bigint[], $6::text[], $16::text[], $17::text[], $18::bigint[]) AS b(sid, seq, "
    "hash, ts, old_seq, old_hash, fn, fr, fg)), "
    "head AS (UPDATE timelines t SET last_seq = b.seq, last_hash = b.hash, "
    "last_timestamp = b.ts FROM b WHERE t.session_id = b.sid AND t.last_seq = b.old_seq "
    "AND t.last_hash = b.old_hash AND t.status = 'active' AND (b.fn IS NULL OR "
    f"{holds('b.fn', 'b.fr', 'b.fg', lock=False)}) RETURNING t.session_id), "
    f"ins AS (INSERT INTO timeline_events ({EVENTS_SQL}) SELECT e.* FROM unnest("
    "$7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::text[], $12::text[], "
    "$13::text[], $14::text[]) AS e(event_id, session_id, seq, ts, event_type, content, "
    "prev_hash, hash) WHERE e.session_id IN (SELECT session_id FROM head) "
    "OR e.session_id = ANY($15::text[]) RETURNING 1) "
    "SELECT session_id FROM head")
_ARCHIVE = ("UPDATE timelines t SET status = 'archived', ended_at = u.e FROM "
            "unnest($1::text[], $2::bigint[]) AS u(s, e) WHERE t.session_id = u.s")
_FOUND = ("SELECT DISTINCT session_id FROM timeline_events "
          "WHERE event_id = ANY($1::text[])")


@dataclass(slots=True)
class Request:
    sid: str
    items: list[Item]
    key: str
    fut: asyncio.Future
    fence: Fence | None = None  # written only while this lane lease is current
    tries: int = 0


@dataclass
class _Plan:
    """One round's statements: per session its head before (None: new) and after."""

    requests: list[Request]
    results: dict[int, list[Any]] = field(default_factory=dict)  # id(request) -> results
    before: dict[str, Head | None] = field(default_factory=dict)
    after: dict[str, Head] = field(default_factory=dict)
    rows: list[tuple] = field(default_factory=list)
    fences: dict[str, Fence] = field(default_factory=dict)  # session -> its lane fence

    def _fence_columns(self, sids: list[str]) -> list[list]:
        got = [self.fences.get(s) for s in sids]
        return [[f[i] if f else None for f in got] for i in range(3)]

    def columns(self) -> tuple[list, list, list, list, list, list]:
        moved = [(s, h, self.before[s]) for s, h in self.after.items()
                 if self.before[s] is not None]
        heads = [[s for s, _, _ in moved], [h.last_seq for _, h, _ in moved],
                 [h.last_hash for _, h, _ in moved], [h.last_ts for _, h, _ in moved],
                 [o.last_seq for _, _, o in moved], [o.last_hash for _, _, o in moved]]
        new = [(s, h) for s, h in self.after.items() if self.before[s] is None]
        creates = [[s for s, _ in new], [h.session_key for _, h in new],
                   [h.created_at for _, h in new], [h.last_seq for _, h in new],
                   [h.last_hash for _, h in new], [h.last_ts for _, h in new],
                   *self._fence_columns([s for s, _ in new])]
        ended = [(s, h.ended_at) for s, h in self.after.items() if h.status == "archived"]
        events = [list(col) for col in zip(*self.rows, strict=True)] or [[]] * 8
        return (heads, creates, events, [s for s, _ in ended], [e for _, e in ended],
                self._fence_columns(heads[0]))


def _closed(conn: Any) -> bool:
    """Whether a held pool connection is gone. asyncpg detaches the proxy itself when the
    server closes the connection, and then even ``is_closed()`` raises InterfaceError."""
    try:
        return conn.is_closed()
    except asyncpg.InterfaceError:
        return True


class AppendBatcher:
    """``await submit(sid, items, key)`` -> per item the committed row or the error."""

    def __init__(self, store: Any) -> None:
        # the PgTimelineStore (not imported: it imports this module): its pool, clock,
        # retry stats, cached heads and locked path
        self.store = store
        self.rounds = self.requeued = 0  # observable: tests and the bench
        self._queue: list[Request] = []
        self._task: asyncio.Task | None = None
        self._conn: Any = None  # held while there is work
        self._broken = False  # the connection met an outage: take another
        self._releasing: set[asyncio.Task] = set()
        self._linger: asyncio.TimerHandle | None = None

    def submit(self, sid: str, items: list[Item], key: str,
               fence: Fence | None = None) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        req = Request(sid, items, key, loop.create_future(), fence)
        self._queue.append(req)
        if self._task is None or self._task.done():
            if self._linger is not None:
                self._linger.cancel()
            self._task = loop.create_task(self._drain(), name="pg-timeline-commit")
        return req.fut

    async def _drain(self) -> None:
        while self._queue:  # again after the release: submit() saw this task running
            try:
                while self._queue:
                    batch = self._queue[:MAX_REQUESTS]
                    del self._queue[:MAX_REQUESTS]
                    try:
                        await self._round(batch)
                    except BaseException as exc:  # never leave a caller waiting
                        for req in batch:
                            if not req.fut.done():
                                req.fut.set_exception(exc)
                        raise
            finally:
                # kept a moment for the next append (a release costs asyncpg's reset
                # round trip), then given back
                self._linger = asyncio.get_running_loop().call_later(
                    LINGER_S, self._release_soon)

    async def _round(self, batch: list[Request]) -> None:
        self.rounds += 1
        contended = {r.sid for r in batch if r.tries >= MAX_TRIES}
        rest = [r for r in batch if r.sid not in contended]
        if rest:
            await self._round_batched(rest)
        for req in batch:  # heads that kept moving: one at a time under the row lock
            if req.sid in contended:
                req.fut.set_result(await self.store.commit_locked(req.sid, req.items,
                                                                  req.key, req.fence))

    async def _round_batched(self, batch: list[Request]) -> None:
        state: dict[str, _Plan] = {}

        async def attempt() -> set[str]:
            state["plan"] = plan = await self._plan(batch)
            return await self._write(plan) if plan.after else set()

        async def recovered() -> set[str] | None:
            # The transaction is atomic: if any of its events is there, it committed,
            # and the sessions written are those whose events are there.
            plan = state.get("plan")
            if plan is None or not plan.rows:
                return None
            conn = await self._connection()
            found = {r[0] for r in await conn.fetch(_FOUND, [r[0] for r in plan.rows])}
            return found or None
        try:
            applied = await ride_out(attempt, what="timeline", stats=self.store.retry,
                                     clock=self.store.clock, deadline_s=OUTAGE_RETRY,
                                     recovered=recovered, on_unreachable=self._forget_all,
                                     sessions=len({r.sid for r in batch}))
        except UNREACHABLE as exc:
            log.error("timeline_write_failed", sessions=len({r.sid for r in batch}),
                      error=f"{type(exc).__name__}: {exc}")
            for req in batch:
                req.fut.set_result([TimelineError(f"timeline write failed: {exc}")
                                    for _ in req.items])
            return
        except asyncpg.PostgresError as exc:
            log.warning("timeline_batch_refused", requests=len(batch), error=str(exc))
            await self._release()
            for req in batch:  # each alone: only the guilty request fails
                req.fut.set_result(await self.store.commit_locked(req.sid, req.items,
                                                                  req.key, req.fence))
            return
        self._settle(state["plan"], applied)

    def _settle(self, plan: _Plan, applied: set[str]) -> None:
        heads = self.store.heads
        lost: list[Request] = []
        for sid, head in plan.after.items():
            if sid in applied and head.status == "active":
                heads[sid] = head.key()
            else:
                heads.pop(sid, None)
        for req in plan.requests:
            if req.sid in plan.after and req.sid not in applied:
                lost.append(req)
            else:
                req.fut.set_result(plan.results[id(req)])
        if lost:  # the head moved under us: read it again, keep each session's order
            self.requeued += len(lost)
            for req in lost:  # a fenced one may have lost its lane: the locked path says
                req.tries = MAX_TRIES if req.fence else req.tries + 1
            self._queue[:0] = lost

    async def _plan(self, batch: list[Request]) -> _Plan:
        plan = _Plan([])
        heads = await self._heads({r.sid for r in batch})
        by_sid: dict[str, list[Request]] = defaultdict(list)
        for req in batch:
            by_sid[req.sid].append(req)
        for sid, reqs in by_sid.items():
            before = heads.get(sid)
            head = Head(*before.key(), before.status) if before is not None else None
            for req in reqs:
                if req.fence is not None:
                    plan.fences.setdefault(sid, req.fence)
                head, rows, results = chain(head, sid, req.items, req.key)
                plan.results[id(req)] = results
                plan.rows.extend(rows)
                if rows:
                    assert head is not None
                    plan.before[sid], plan.after[sid] = before, head
            plan.requests.extend(reqs)
        return plan

    async def _heads(self, sids: set[str]) -> dict[str, Head]:
        """Every session's head: from the cache, the others read in one SELECT."""
        cached = self.store.heads
        out = {s: Head(*cached[s], "active") for s in sids if s in cached}
        missing = [s for s in sids if s not in cached]
        if missing:
            conn = await self._connection()
            for sid, seq, h, ts, status in await conn.fetch(_HEADS, missing):
                out[sid] = Head(seq, h, ts, status)
        return out

    async def _write(self, plan: _Plan) -> set[str]:
        """The round's statements; returns the sessions written (the others' heads had
        moved: nothing of theirs was written)."""
        heads, creates, events, ended, ended_at, fences = plan.columns()
        conn = await self._connection()
        if not creates[0] and not ended:  # the common case: one statement, one round trip
            return {r[0] for r in await conn.fetch(_BATCH, *heads, *events, [], *fences)}
        async with conn.transaction():
            created = [r[0] for r in await conn.fetch(_CREATE, *creates)] \
                if creates[0] else []
            applied = {r[0] for r in await conn.fetch(_BATCH, *heads, *events, created,
                                                      *fences)}
            applied.update(created)
            done = [(s, e) for s, e in zip(ended, ended_at, strict=True) if s in applied]
            if done:
                await conn.execute(_ARCHIVE, [s for s, _ in done], [e for _, e in done])
        for sid, _ in done:
            log.info("timeline_archived", session_id=sid, events=plan.after[sid].last_seq)
        return applied

    def _forget_all(self) -> None:
        self.store.heads.clear()  # after a cut nothing cached is trusted
        self._broken = True

    async def _connection(self) -> Any:
        if self._broken or (self._conn is not None and _closed(self._conn)):
            self._broken = False
            await self._release()
        if self._conn is None:
            self._conn = await self.store.pool.acquire()
        return self._conn

    async def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a broken connection: the pool drops it
                await self.store.pool.release(conn)

    def _release_soon(self) -> None:
        """Give the connection back without making the next round wait for asyncpg's
        reset query (the next round takes another idle connection)."""
        if self._conn is not None:
            task = asyncio.get_running_loop().create_task(self._release())
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def close(self) -> None:
        """Wait until everything submitted is written, give the connection back."""
        while self._task is not None and not self._task.done():
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._task)
        if self._linger is not None:
            self._linger.cancel()
        self._release_soon()
        await asyncio.gather(*self._releasing, return_exceptions=True)
