"""The cluster work queue: where a ``cluster_work`` row runs (issue 15 "Lanes",
"Messages received by another replica"; README "Replicas").

An accepted row (gateway/cluster/journal.py) goes to the replica that holds the session's
lane lease (``lane:<session key>``):

- nobody holds it (or its holder is dead): this replica takes the lease and runs the
  message on its own :class:`~runtime.lanes.LaneManager`, so the queue modes (collect,
  steer, followup, interrupt) work exactly as on one host;
- another live replica holds it: the row's ``target`` becomes that replica and a
  ``NOTIFY tidegate_work`` wakes it; it claims its rows with ``FOR UPDATE SKIP LOCKED``
  and submits them to its lanes. A session's turns therefore run on one replica at a time.

A lane lease is given back once the lane has been idle for ``idle_release`` seconds and
no row waits for it. Rows of a dead replica (its heartbeat older than the lease TTL) are
taken over by any live replica: unfinished turns run again there; a turn whose reply had
begun is marked done and reported ``unconfirmed`` (never sent twice).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

import asyncpg
import structlog

from gateway.cluster import adopt, commands, membership, takeover
from gateway.cluster.adopt import Assigned
from gateway.cluster.db import ClusterDB, ClusterUnavailable
from gateway.cluster.fencing import LaneFences
from gateway.cluster.insert_once import insert_row
from gateway.cluster.journal import Forwarded, WorkJournal
from gateway.turns.work import CommandWork, UserWork
from runtime.lanes import LaneManager

__all__ = ["CHANNEL", "IDLE_RELEASE", "ClusterWork", "Forwarded"]

log = structlog.get_logger(__name__)

LEASE_ASKS = 3  # times a lane's lease row is asked when each answer came back late

CHANNEL = takeover.CHANNEL  # NOTIFY payload: the target replica id
IDLE_RELEASE = 2.0  # seconds a lane stays leased after its last turn


class ClusterWork(WorkJournal):
    """Lane routing (``submit``), the queue (``claim``, ``release_idle``, ``take_over``)
    and, inherited, the journal marks (:class:`~gateway.cluster.journal.WorkJournal`)
    for one replica."""

    def __init__(self, db: ClusterDB, replica: str, ttl: float, lanes: LaneManager, *,
                 side_effecting: Any, debounce: Any) -> None:
        super().__init__(db, replica, side_effecting=side_effecting)
        self.ttl, self.local = ttl, lanes
        self.debounce = debounce  # (channel, account) -> idle debounce seconds
        self.idle_release = IDLE_RELEASE
        self.held: dict[str, float] = {}  # session key -> loop time of last activity
        self._locks: dict[str, list[Any]] = {}  # key -> [lock, users]
        # session key -> set once the rows a claim marked running here are on the lane
        self._starting: dict[str, asyncio.Event] = {}
        self._claims: set[asyncio.Event] = set()  # claims in flight, set when they end
        self.forwarded = self.claimed = self.taken_over = 0
        self.on_lane_gone: Any = None  # session key -> None (the service forgets caches)
        # the lane lease generations the session's timeline and session-store writes carry
        self.fences = LaneFences(replica, lambda k: lanes is not None and lanes.is_busy(k))
        self.on_lane_taken: Any = None  # async (key): the lane is now run here
        self.on_lane_release: Any = None  # async (key): before an idle lane is given back
        self.on_interrupted: Any = None  # async (key, work, tools): a taken-over turn's
        # side-effecting tools had begun on the dead replica
        self.on_reply_cut: Any = None  # async (key, work, reply, row id): its reply had begun
        self.on_dead_letter: Any = None  # async (row, crashes): set aside after 3 crashes
        self.outcome_known: Any = None  # row id -> whether its outcome is recorded here
        # (work, key, lane future): records the outcome of a row claimed or taken over
        # here however its turn ends (the recorder's ``watch``; intake watches its own)
        self.watch_outcome: Any = None
        self.keeps_lane: Any = None  # key -> True while something waits here (events)
        # keys lane_lost forgot whose lease row may still name this replica (nobody took
        # it): given back by release_idle once nothing runs or waits here for them
        self._forgotten: set[str] = set()
        # db.clock.monotonic() when the last heartbeat that got through was sent (the
        # service's beat loop): while younger than half the TTL, nobody can have judged
        # this replica dead and taken its lanes
        self.beat_at: float | None = None
        self._unverified: set[str] = set()  # held lanes to check after a gap in the beats
        self._moved: set[str] = set()  # lanes whose lease was seen taken by another replica

    def lane_lost(self, key: str) -> None:
        """The lane lease of ``key`` is no longer this replica's (it moved while this
        process was paused or cut off), or may not be (its beats were late): forget it
        and what was cached for it."""
        self.held.pop(key, None)
        self._forgotten.add(key)
        self.fences.lost(key)
        log.warning("cluster_lane_lost", session_key=key, replica=self.me)
        if self.on_lane_gone is not None:
            self.on_lane_gone(key)

    def beat_ok(self, sent: float) -> None:
        """A heartbeat sent at ``sent`` (db.clock.monotonic()) got through. After a gap of
        more than half the TTL since the one before (a pause, an outage) this replica may
        have been judged dead meanwhile: the lanes it holds are checked against their
        lease rows before their next model call (:meth:`runs_lane`)."""
        if self.beat_at is not None and sent - self.beat_at > self.ttl / 2:
            self._unverified.update(self.held)
        self.beat_at = sent

    def runs_lane(self, key: str) -> bool | Awaitable[bool]:
        """Whether the lane of ``key`` is still run here, asked before each model round of
        its turns (TurnInput ``lane_held``). True without a query while the lane is held,
        checked and the heartbeat unbroken and fresh (a lease is only taken from a holder
        judged dead), or when no lane lease of ``key`` was taken here (nothing to lose).
        Else (beats late or broken: paused, cut off, maybe taken over and not seen yet) an
        awaitable answer from the lease row (:meth:`_lease_still_mine`)."""
        if self.fences.holds(key):
            self._moved.discard(key)
            now = self.db.clock.monotonic()
            if key not in self._unverified and self.beat_at is not None and \
                    now - self.beat_at < self.ttl / 2:
                return True
        elif key in self._moved:  # seen taken over, not taken back here since
            return False
        token = self.fences.token(key)
        return True if token is None else self._lease_still_mine(key, token)

    async def _lease_still_mine(self, key: str, token: tuple[str, str, int]) -> bool:
        """Whether the lane lease row still names this replica with the generation taken
        here (``token``: LaneFences.token); when not, the lane is forgotten
        (:meth:`lane_lost`). PostgreSQL unreachable: True (the turn's writes and reply
        stay fenced by the database; only its model call is not). An answer that took
        longer than half the TTL (this process stalled or was paused while it waited: the
        row may have changed hands since it was read, or the query timed out on the
        wake-up) is asked again, up to :data:`LEASE_ASKS` times."""
        for _ in range(LEASE_ASKS):
            asked = self.db.clock.monotonic()
            try:
                mine = bool(await self.db.run(lambda c: c.fetchval(
                    "SELECT true FROM cluster_leases WHERE name = $1 AND replica_id = $2 "
                    "AND generation = $3", *token)))
            except ClusterUnavailable:
                mine = None
            if self.db.clock.monotonic() - asked <= self.ttl / 2:
                break
        if mine is None:
            return True
        if mine:
            self._unverified.discard(key)
            return True
        self._moved.add(key)
        if self.fences.holds(key) or key in self.held:
            self.lane_lost(key)
        return False

    # -- routing -------------------------------------------------------------------------
    def submit(self, key: str, work: UserWork, kw: dict[str, Any]) -> asyncio.Future:
        """Run ``work`` (a journaled message) on the lane of ``key`` wherever it runs."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._spawn(self._route(key, work, fut, kw))
        return fut

    async def _route(self, key: str, work: UserWork, fut: asyncio.Future,
                     kw: dict[str, Any]) -> None:
        entry = self._locks.setdefault(key, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:  # messages of one session keep their order here
                if isinstance(work, CommandWork) and work.journal_id is None:
                    work.journal_id = str(await insert_row(
                        self.db, key, commands.payload(work), self.me, what="intake"))
                row_id = int(work.journal_id or 0)
                # an album's parts are rows too: they go where the album runs
                ids = [row_id, *(int(i) for i in getattr(work, "album_parts", ()))]
                if all(i in self._fast for i in ids):
                    self._fast.difference_update(ids)
                    await self._claims_started(key)
                    _chain(self._run_here(key, work, **kw), fut)
                    return
                self._fast.difference_update(ids)
                got = await self.db.retry(
                    lambda c: self._assign_rows(c, key, ids), what="lane")
                self._handed_over(got)
                holder = got.holder
                if holder == self.me:
                    await self._enter(key)
                    await self._start_rows(got.adopted)  # a dead replica's older rows first
                    await self._claims_started(key)
                    _chain(self._run_here(key, work, **kw), fut)
                    return
        except BaseException as exc:
            if not fut.done():
                fut.set_exception(exc) if isinstance(exc, Exception) else fut.cancel()
            raise
        finally:
            entry[1] -= 1
            if entry[1] == 0 and self._locks.get(key) is entry:
                del self._locks[key]
        self.forwarded += 1
        log.info("cluster_work_forwarded", session_key=key, replica=holder,
                 entry_id=work.journal_id)
        if isinstance(work, UserWork):  # the holder records its one outcome
            work.outcome = "forwarded"
        fut.set_result(Forwarded(holder))

    async def _assign(self, conn: asyncpg.Connection, key: str, ids: list[int]) -> str:
        """:meth:`_assign_rows`, returning the lane's holder."""
        return (await self._assign_rows(conn, key, ids)).holder

    async def _assign_rows(self, conn: asyncpg.Connection, key: str, ids: list[int], *,
                           wait: bool = True) -> Assigned:
        """In one transaction: hand the session's older rows of a dead replica over
        (gateway/cluster/adopt.py; ``wait=False``: skip those another transaction
        holds), take or find the lane lease, mark the rows running here or queue them
        for the holder (and wake it)."""
        ttl = self.db.peer_ttl(self.ttl)  # nobody is dead just after an outage
        async with conn.transaction():
            dead = await adopt.lock_dead_rows(conn, key, min(ids), self.me, ttl, wait=wait)
            letters, dead = await adopt.set_aside(conn, dead)
            # routing a new message (not a claim): older rows queued here go first
            queued = await adopt.lock_queued_rows(conn, key, min(ids), self.me) if wait \
                else []
            holder, generation = await membership.acquire_fenced(conn, "lane:" + key,
                                                                 self.me, ttl)
            adopted = await adopt.hand_over(conn, dead, holder, self.me)
            if holder == self.me:
                if queued:
                    await conn.execute("UPDATE cluster_work SET state = 'running' WHERE "
                                       "id = ANY($1::bigint[])", [r["id"] for r in queued])
                    adopted = adopted + queued
                adopted = adopt.resume_order(adopted)
                self.fences.took(key, generation)
                await conn.execute("UPDATE cluster_work SET target = $2, state = 'running' "
                                   "WHERE id = ANY($1::bigint[])", ids, self.me)
            else:
                await conn.execute("UPDATE cluster_work SET target = $2, state = 'queued' "
                                   "WHERE id = ANY($1::bigint[])", ids, holder)
                await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, holder)
        return Assigned(holder, adopted, dead, letters)

    def _handed_over(self, got: Assigned) -> None:
        """Log the dead replica's rows routing handed over; resolve the replies cut."""
        self._taken(got.dead, reason="an older row")
        self._set_aside(got.dead_letters)

    def _taken(self, rows: list[Any], **why: Any) -> None:
        takeover.log_taken_over(rows, **why)
        self.taken_over += len(rows)
        for cut in takeover.cut_replies(rows) if self.on_reply_cut is not None else ():
            self._spawn(takeover.resolve_once(self, cut))

    def _set_aside(self, letters: list[Any]) -> None:
        """Dead letters of a takeover (gateway/cluster/crashes.py): recorded and the
        user told by ``on_dead_letter`` (row, crashes)."""
        for row, crashes in letters:
            self.taken_over += 1
            if self.on_dead_letter is not None:
                self._spawn(self.on_dead_letter(row, crashes))

    async def _enter(self, key: str) -> None:
        """The lane of ``key`` starts running here: what another replica stored for the
        session (its session-store row) is read first."""
        if key not in self.held and self.on_lane_taken is not None:
            try:
                await self.on_lane_taken(key)
            except OSError as exc:  # an outage: the entry held here is used
                log.warning("cluster_lane_reload_failed", session_key=key, error=str(exc))

    def _run_here(self, key: str, work: UserWork, **kw: Any) -> asyncio.Future:
        self.held[key] = asyncio.get_running_loop().time()
        fut = self.local.submit(key, work, **kw)
        fut.add_done_callback(lambda _f: self._touch(key))
        return fut

    def _touch(self, key: str) -> None:
        if key in self.held:
            self.held[key] = asyncio.get_running_loop().time()

    # -- the queue: claiming, releasing, taking over -------------------------------------
    async def claim(self) -> int:
        """Run the rows queued for this replica (oldest first). Returns how many."""
        if self.local.closed:
            return 0  # stopping: the rows are taken over once this replica has left
        keys: list[str] = []  # sessions whose claimed rows routing waits for
        ended = asyncio.Event()
        self._claims.add(ended)
        try:
            rows, handed = await self.db.run(lambda c: self._claim_rows(c, keys))
            for got in handed:
                self._handed_over(got)
            await self._start_rows(rows)
        finally:
            for key in keys:
                if (started := self._starting.pop(key, None)) is not None:
                    started.set()
            self._claims.discard(ended)
            ended.set()
        self.claimed += len(rows)
        return len(rows)

    async def _claims_started(self, key: str) -> None:
        """Wait until the rows of ``key`` a claim has just marked running here are on the
        local lane: a message routed meanwhile goes behind them, not before. A claim in
        flight may hold such rows still uncommitted (routing skipped them, locked), so
        routing waits for the claims in flight to end."""
        for ended in list(self._claims):
            await ended.wait()
        while (started := self._starting.get(key)) is not None:
            await started.wait()

    async def _start_rows(self, rows: list[Any]) -> None:
        """Run ``rows`` (claimed, or handed over from a dead replica) on the local lane in
        order, resumed by the single-host rules when their turn may have begun elsewhere.
        The begun rows of one turn (merged, steered in: :func:`adopt.turns`) run as that
        one turn again, with one notice, as a restart resumes them on one host; each
        alone, the second answered again what the first one's turn answered."""
        for group in adopt.turns(rows):
            ready = [got for r in group if (got := await self._resumed_row(r)) is not None]
            if not ready:
                continue
            r, work = ready[0]
            tools = [t for row, _ in ready for t in (row["tools"] or ())]
            if tools and isinstance(work, UserWork) and self.on_interrupted:
                # side-effecting tools began there: not run again blindly, as on one
                # host (README "Delivery guarantees": continue)
                for _, w in ready:
                    w.resume = "continue" if w.resume is not None else None
                await self.on_interrupted(r["session_key"], work, tools)
            await self._enter(r["session_key"])
            for r, work in ready:  # no await between: the lane merges them into one turn
                self._submit_row(r, work, joined=len(ready) > 1)

    async def _resumed_row(self, r: Any) -> tuple[Any, Any] | None:
        """Row ``r``'s work, marked ``rerun`` when its turn may have begun on a replica
        that died; None when its message has its outcome already (not run again)."""
        work = commands.decode(json.loads(r["work"]), str(r["id"]))
        if isinstance(work, UserWork):  # what tainted its turn before: still in its context
            work.tainted_by = list(r.get("taint") or [])
        if (r["started"] or r["taken_over"]) and await takeover.ended(self, r):
            return None
        if (r["started"] or r["taken_over"]) and work.resume is None:
            # its turn may have begun on a replica that died: the transcript may hold
            # its message already (committed before the model call), not written twice
            work.resume = "rerun"
        return r, work

    def _submit_row(self, r: Any, work: Any, *, joined: bool) -> None:
        """Put row ``r``'s ``work`` on the local lane (``joined``: one of several rows of
        one turn, merged with the others into one batch whatever the queue mode)."""
        kw = ({"mergeable": False} if isinstance(work, CommandWork) else
              {"idle_debounce": self.debounce(work.channel, work.account_id)})
        if joined and isinstance(work, UserWork):
            kw["mode"] = "collect"
        if self.forwarding is not None:
            self.forwarding.claimed(r["id"], work)
        fut = self._run_here(r["session_key"], work, **kw)
        self.watch(work, fut)
        if self.watch_outcome is not None and isinstance(work, UserWork):
            self.watch_outcome(work, r["session_key"], fut)
        log.info("cluster_work_claimed", session_key=r["session_key"], entry_id=r["id"],
                 run_id=work.run_id, resume=work.resume)

    async def _claim_rows(self, conn: asyncpg.Connection, keys: list[str]
                          ) -> tuple[list[Any], list[Assigned]]:
        async with conn.transaction():
            rows = await conn.fetch(
                "SELECT id, session_key, work, started, taken_over, tools, taint, run_id "
                "FROM cluster_work "
                "WHERE target = $1 AND state = 'queued' ORDER BY id FOR UPDATE SKIP LOCKED "
                "LIMIT 500", self.me)
            mine: list[Any] = []
            handed: list[Assigned] = []
            by_key: dict[str, list[Any]] = {}
            for r in rows:
                by_key.setdefault(r["session_key"], []).append(r)
            for key, group in by_key.items():
                ids = [r["id"] for r in group]
                # The lease may have moved since the row was queued: follow it.
                got = await self._assign_rows(conn, key, ids, wait=False)
                handed.append(got)
                if got.holder == self.me:
                    mine += adopt.resume_order(got.adopted + group)
        for key in dict.fromkeys(r["session_key"] for r in mine):  # committed: routing
            if key not in self._starting:  # waits for these rows to reach the lane
                self._starting[key] = asyncio.Event()
                keys.append(key)
        return mine, handed

    async def release_idle(self) -> None:
        """Give back lane leases idle for ``idle_release`` seconds with nothing waiting."""
        now = asyncio.get_running_loop().time()
        for key, last in list(self.held.items()):
            if self.local.is_busy(key) or now - last < self.idle_release or \
                    key in self._locks or key in self._inflight or \
                    (self.keeps_lane is not None and self.keeps_lane(key)):
                continue
            if self.on_lane_release is not None:  # the session row is out before
                try:
                    await self.on_lane_release(key)
                except OSError:  # not written: keep the lane, try again next tick
                    continue
            if self.held.get(key) != last or self.local.is_busy(key) or \
                    key in self._locks or key in self._inflight:
                continue  # lost, or used again, while the row was written
            del self.held[key]  # from now on a message for it takes the lease path
            if self.on_lane_gone is not None:
                self.on_lane_gone(key)  # another replica may run it next
            still = await self._give_back(key)
            if still == self.me and key not in self.held:
                self.held[key] = now  # rows still open here: keep it for now
            elif still != self.me:
                self.fences.released(key)
        await self._release_forgotten()

    async def _release_forgotten(self) -> None:
        """Give back the lane leases :meth:`lane_lost` forgot that still name this
        replica (its beats were late but nobody took them), once nothing runs, routes or
        waits here for them. Left in place, such a lease was never released: a turn
        waiting on another replica for the lane (a cron run, gateway/cluster/
        synthetic.py) waited until this replica happened to run that session again."""
        for key in list(self._forgotten):
            if key in self.held or self.fences.holds(key):  # taken again here (routing,
                self._forgotten.discard(key)  # a claim, a synthetic turn): released idle
                continue
            if (self.local is not None and self.local.is_busy(key)) or key in self._locks or \
                    key in self._inflight or \
                    (self.keeps_lane is not None and self.keeps_lane(key)):
                continue
            still = await self._give_back(key)
            if still != self.me and key not in self.held:
                self._forgotten.discard(key)

    async def _give_back(self, key: str) -> str | None:
        """Delete this replica's lease of the lane of ``key`` unless rows of the session
        are still open here; returns the lease's holder afterwards (this replica also
        while PostgreSQL is out of reach)."""
        try:
            await self.db.run(lambda c: c.execute(
                "DELETE FROM cluster_leases WHERE name = $1 AND replica_id = $2 AND NOT "
                "EXISTS (SELECT 1 FROM cluster_work WHERE session_key = $3 AND "
                "target = $2 AND state <> 'done')", "lane:" + key, self.me, key))
            return await self.db.run(lambda c: c.fetchval(
                "SELECT replica_id FROM cluster_leases WHERE name = $1", "lane:" + key))
        except ClusterUnavailable:
            return self.me

    async def take_over(self) -> int:
        """Rows whose target replica is dead: requeue them through the lane lease; a
        reply that had begun is marked done, unconfirmed."""
        ttl = self.db.peer_ttl(self.ttl)  # nobody is dead just after an outage
        rows, letters = await self.db.run(lambda c: takeover.orphans(c, self.me, ttl))
        self._taken(rows)
        self._set_aside(letters)
        return len(rows) + len(letters)


def _chain(inner: asyncio.Future, outer: asyncio.Future) -> None:
    def copy(f: asyncio.Future) -> None:
        if outer.done():
            return
        if f.cancelled():
            outer.cancel()
        elif f.exception() is not None:
            outer.set_exception(f.exception())  # type: ignore[arg-type]
        else:
            outer.set_result(f.result())
    inner.add_done_callback(copy)
