"""One replica's cluster service: opens PostgreSQL, migrates, hooks the cluster journal,
lanes, accounts, cron ledger, heartbeat slots and system-event hand-off into the gateway,
and runs the loop that keeps them going (issue 15 "Replicas").

The loop ticks every ``lease_ttl / 5`` seconds (0.2-3 s): takeover of dead replicas'
work, cron occurrences and queued replies, exec approvals waited for here or left by
dead replicas, idle lane leases, and a snapshot of the cluster for ``status`` (kept
while PostgreSQL is down, with the outage: ``cluster.postgres.state`` is ``down`` and
``down_since`` says since when).
NOTIFY wakes the loop early; the tick is the fallback for a lost notification. The
heartbeat row and account ownership have loops of their own, so a slow tick delays neither.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any

import asyncpg
import structlog

from gateway.cluster import membership, session_fences, takeover
from gateway.cluster.accounts import OUTBOUND, Accounts
from gateway.cluster.approvals import ClusterApprovals
from gateway.cluster.cron_jobs import SharedJobs, shared_jobs
from gateway.cluster.db import ClusterDB, ClusterUnavailable
from gateway.cluster.forwarding import TurnForwarding
from gateway.cluster.lanes import ClusterLanes
from gateway.cluster.occurrences import CronLedger, HeartbeatSlots
from gateway.cluster.synthetic import HEARTBEAT, WAKE, SyntheticTurns, take
from gateway.cluster.work import CHANNEL, ClusterWork
from gateway.journal import dead_letters
from gateway.journal.resume import INTERRUPTED_NOTICE, interrupted_event

log = structlog.get_logger(__name__)

EVENTS = "tidegate_events"
ABORT = "cluster.abort"  # event source: stop the lane's running turn (/stop)


class Cluster:
    """Build with the gateway after ``build()``; ``await open()`` before the channels,
    ``await start_channels()`` in their place, ``await close()`` at stop."""

    def __init__(self, gw: Any) -> None:
        from channels.config import channel_debounce

        cfg = gw.config
        self.gw = gw
        self.ttl = float(cfg.cluster.lease_ttl)
        self.me = membership.default_replica_id(cfg.cluster.replica_id)
        pool = cfg.storage.pool
        self.db = ClusterDB(cfg.storage.dsn, min_size=pool.min, max_size=pool.max,
                            clock=gw.clock)
        self.work = ClusterWork(
            self.db, self.me, self.ttl, gw.lanes, side_effecting=gw.tools.side_effecting,
            debounce=lambda ch, acc: channel_debounce(gw.config.channels, ch, acc))
        self.work.on_lane_gone = gw.logs.forget_key  # the next turn here reloads it
        # a lane with system events waiting here is kept until a turn drains them
        self.work.keeps_lane = lambda key: bool(gw.scheduling.events.peek(key))
        self.work.forwarding = TurnForwarding(self.db, self.me, gw.bus)  # callers' turns
        self.cron = CronLedger(self.db, self.me, self.ttl)
        self.slots = HeartbeatSlots(self.db, self.me)
        self.accounts: Accounts | None = None
        self.jobs: SharedJobs | None = None  # cron definitions shared through cron_jobs
        self.snapshot: dict[str, Any] = {}
        self.snapshot_at: float | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._drain = asyncio.Event()
        self._claim = asyncio.Event()
        self._events_claim: asyncio.Task | None = None  # handed-over events being claimed
        self.approvals = ClusterApprovals(gw, self.db, self.me, self.ttl)  # shared records
        self.db.listen(CHANNEL, self._on_work)
        self.db.listen(OUTBOUND, self._on_outbound)
        self.db.listen(EVENTS, self._on_event)

    # -- wiring --------------------------------------------------------------------------
    async def open(self) -> None:
        """Write the heartbeat row (the gateway has migrated the schema: the cluster's
        tables are migration 0100), hook in."""
        gw = self.gw
        if gw.scheduling.cron is not None:  # LISTEN before the listener opens
            self.jobs = shared_jobs(gw.scheduling.cron, gw.scheduling.cron_store.records,
                                    self.db)
        if getattr(gw, "waited_for_database", False):  # started during an outage: the
            self.db.back_at = gw.clock.monotonic()  # others' heartbeats are stale too
        await self.db.retry(lambda c: membership.rejoin(c, self.me, gw.port), what="join")
        session_fences.wire(gw, self.work)  # timeline and session rows under the lane
        gw.outcomes.shared = True  # `sessions outcomes` on any replica reads the timeline
        gw.intake.journal = gw.executor.journal = self.work
        gw.executor.lane_held = self.work.runs_lane  # asked before each model round
        gw.executor.events_arriving = self._events_arriving
        gw.intake.lanes = lanes = ClusterLanes(self.work)
        lanes.abort_elsewhere = self.abort_elsewhere
        lanes.synthetic = self.synthetic = SyntheticTurns(self.work)  # heartbeat, cron...
        sched = gw.scheduling
        if sched.cron is not None:
            sched.cron.occurrences = self.cron
        sched.heartbeat.slot_gate = self.slots.claim
        self._local_enqueue = sched.enqueue
        sched.enqueue = self.enqueue_event
        self.work.on_interrupted = self._interrupted
        self.work.on_reply_cut = lambda *cut: takeover.resolve_cut_reply(gw, *cut)
        self.work.on_dead_letter = partial(dead_letters.set_aside_row, gw)
        self.work.outcome_known = lambda i: gw.journal is not None and \
            i in gw.journal.outcomes.rows
        self.work.watch_outcome = gw.outcomes.watch
        log.info("cluster_joined", replica=self.me, lease_ttl=self.ttl)

    async def start_channels(self) -> None:
        """In place of ``start_channels``: start only the accounts this replica owns."""
        from gateway.channels.boot import ChannelWatch

        self.accounts = Accounts(self.gw, self.db, self.me, self.ttl)
        await self.accounts.start_webhooks()
        await self._step("accounts", self.accounts.tick)
        if self.gw.channels:
            watch = ChannelWatch(self.gw.channels, self.gw.outbox, self.gw.clock)
            await watch.start()
            self.gw.extra_services.append(watch)
        await self._step("snapshot", self._refresh)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._beat_loop(), name="cluster-heartbeat"),
                       loop.create_task(self._loop(), name="cluster"),
                       loop.create_task(self._accounts_loop(), name="cluster-accounts"),
                       loop.create_task(self._claim_loop(), name="cluster-claim"),
                       loop.create_task(self._drain_loop(), name="cluster-outbound")]

    async def close(self) -> None:
        """Stop the loop and the owned accounts, give the leases back, close the pool.
        Work still queued here is taken over by the others (its rows stay open)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.accounts is not None:
            await self.accounts.stop()
        await self.work.close()
        if self.jobs is not None:
            await self.jobs.close()
        await session_fences.settle(self.gw)  # written under the leases, then given back
        try:
            await self.db.run(lambda c: membership.leave(c, self.me))
        except ClusterUnavailable:
            pass
        await self.db.close()

    # -- the loop ------------------------------------------------------------------------
    def _interval(self) -> float:
        return min(3.0, max(0.2, self.ttl / 5))

    async def _loop(self) -> None:
        while True:
            await _wait(self._wake, self._interval())
            await self.tick()

    async def _beat_loop(self) -> None:
        """The heartbeat row, on its own so a busy tick never lets the lease lapse. When
        no beat got through for most of a TTL — beats failed, or this process was paused
        (SIGSTOP, a stall) — other replicas may have taken this one's lanes: held lanes
        (and their cached transcripts) are forgotten before the next beat, so new messages
        go through the lease again (the database fences the rest: fencing.py)."""
        last_ok = time.monotonic()
        while True:
            if time.monotonic() - last_ok > 0.8 * self.ttl and self.work.held:
                for key in list(self.work.held):
                    self.work.lane_lost(key)
            try:
                sent = self.db.clock.monotonic()
                await self.db.run(lambda c: membership.beat(c, self.me, self.gw.port))
                last_ok = time.monotonic()
                self.work.beat_ok(sent)  # turns skip the lease query while it is fresh
            except ClusterUnavailable:
                pass
            except Exception:
                log.exception("cluster_step_failed", step="heartbeat")
            await asyncio.sleep(min(1.0, self.ttl / 4))

    async def _accounts_loop(self) -> None:
        """Account ownership, off the busy tick (it held back the hand-over under load)."""
        while True:
            await asyncio.sleep(self._interval())
            if self.accounts is not None:
                await self._step("accounts", self.accounts.tick)
                await self._step("outbound", self.accounts.requeue_dead)

    async def _claim_loop(self) -> None:
        """Rows queued for this replica, as soon as a NOTIFY says so."""
        while True:
            await _wait(self._claim, self._interval())
            await self._step("claim", self.work.claim)

    async def _drain_loop(self) -> None:
        while True:
            await _wait(self._drain, self._interval())
            if self.accounts is not None:
                await self._step("outbound", self.accounts.drain)

    async def tick(self) -> None:
        """One round; every step survives a PostgreSQL outage (retried next tick)."""
        await self._step("takeover", self.work.take_over)
        await self._step("cron", self._cron_orphans)
        if self.jobs is not None:
            await self._step("cron jobs", self.jobs.tick)
        await self._step("outbox", self._adopt_outbox)
        await self._step("events", self._claim_events)
        await self._step("approvals", self.approvals.tick)
        await self._step("lanes", self.work.release_idle)
        await self._step("snapshot", self._refresh)

    async def _step(self, what: str, fn: Any) -> None:
        try:
            await fn()
        except ClusterUnavailable:
            pass  # recorded by ClusterDB; status shows the outage
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("cluster_step_failed", step=what)

    def _on_work(self, payload: str) -> None:
        if payload == self.me:
            self._claim.set()

    def _on_outbound(self, payload: str) -> None:
        if self.accounts is not None and payload in self.accounts.running:
            self._drain.set()

    def _on_event(self, payload: str) -> None:
        if payload == self.me:  # handed over events first: the next turn may drain them
            task = asyncio.get_running_loop().create_task(self._step("events",
                                                                     self._claim_events))
            self.work._tasks.add(task)
            task.add_done_callback(self.work._tasks.discard)
            self._events_claim = task
            self._wake.set()

    async def _events_arriving(self, _key: str) -> None:
        """The turn executor's wait before a user turn drains its system events: events
        whose NOTIFY came in before the turn began are claimed first (no round trip when
        none is on its way)."""
        task = self._events_claim
        if task is not None and not task.done():
            await asyncio.shield(task)

    async def _refresh(self) -> None:
        self.snapshot = await self.db.run(lambda c: membership.snapshot(c, self.ttl))
        self.snapshot_at = time.time()

    async def _adopt_outbox(self) -> None:
        """Queued replies of replicas that died: delivered from here now."""
        if self.db.peer_ttl(self.ttl) != self.ttl:
            return  # just after an outage: the others are reconnecting, not dead
        try:
            await asyncio.to_thread(self.gw.outbox.adopt)
        except OSError as exc:  # an outage: next tick
            log.info("outbox_adopt_failed", error=str(exc))

    async def _cron_orphans(self) -> None:
        cron = self.gw.scheduling.cron
        busy = set(cron.running_jobs()) if cron is not None else set()
        for job_id, due_at in await self.cron.orphans(busy):
            if cron is None or not cron.retry_occurrence(job_id, due_at):
                await self.cron.finished(job_id, due_at, "error")
                log.error("cron_occurrence_abandoned", job_id=job_id, due_at=due_at,
                          reason="job unknown or already running on this replica")

    # -- system events -------------------------------------------------------------------
    def enqueue_event(self, session_key: str, text: str, source: str,
                      wake: bool = False, taint: tuple[str, ...] | list[str] = ()) -> bool:
        """``Scheduling.enqueue`` for the cluster: a session whose lane runs on another
        replica gets the event there, with its ``taint`` (best effort, like the queue
        itself)."""
        if session_key in self.work.held or not self.snapshot:
            return self._local_enqueue(session_key, text, source, wake, taint=taint)
        self.work._spawn(self._send_event(session_key, text, source, wake, tuple(taint)))
        return True

    async def send_event(self, session_key: str, text: str, source: str,
                         wake: bool = False) -> bool:
        """:meth:`enqueue_event`, returning once the event is queued where the session's
        lane runs (handed to its holder, or this replica took the free lane): the
        control API's ``system event``, so the next turn anywhere drains it."""
        if session_key in self.work.held or not self.snapshot:
            return self._local_enqueue(session_key, text, source, wake)
        await self._send_event(session_key, text, source, wake, ())
        return True

    def abort_elsewhere(self, key: str, drop_queued: bool) -> str | None:
        """``/stop`` for a lane another replica runs: ask it (an event of source ABORT)."""
        holder = self._lane_holder(key)
        if holder is not None:
            self.work._spawn(self._send_event(key, "all" if drop_queued else "", ABORT,
                                              False, ()))
        return holder

    async def _interrupted(self, key: str, work: Any, tools: list[str]) -> None:
        """A turn taken over from a dead replica had begun side-effecting tools: as a
        restart on one host (gateway/journal/resume.py ``continue``), the lane that runs
        it now gets a system event naming them and the user one short notice."""
        self._local_enqueue(key, interrupted_event(work, tools), "gateway.resume", False)
        if work.route is not None:
            await self.gw.deliverer.send(work.route, INTERRUPTED_NOTICE, kind="notice",
                                         session_key=key)

    def _deliver_event(self, key: str, text: str, source: str, wake: bool,
                       taint: tuple[str, ...] = ()) -> None:
        if source == ABORT:
            self.gw.lanes.abort(key, drop_queued=text == "all")
        elif source == HEARTBEAT:  # a beat another replica's timer handed to this lane
            self.gw.scheduling.heartbeat.run_handed(text)
        elif source == WAKE:  # a system-event turn another replica handed to this lane
            self.gw.scheduling.wake(key, text)
        else:
            self._local_enqueue(key, text, source, wake, taint=taint)

    async def _send_event(self, key: str, text: str, source: str, wake: bool,
                          taint: tuple[str, ...]) -> None:
        async def go(conn: asyncpg.Connection) -> str | None:
            holder = await conn.fetchval("SELECT l.replica_id FROM cluster_leases l JOIN "
                                         "cluster_replicas r ON r.id = l.replica_id WHERE "
                                         f"l.name = $1 AND {membership.alive('$2')}",
                                         "lane:" + key, self.ttl)
            if holder is None:  # a free lane: taken here, so the next turn runs here
                got = await take(conn, self.work, key)  # (no row of its own to route)
                self.work._handed_over(got)
                adopted[:], holder = got.adopted, got.holder
            if holder == self.me:
                return None
            async with conn.transaction():
                await conn.execute("INSERT INTO cluster_events (target, session_key, text, "
                                   "source, wake, taint) VALUES ($1, $2, $3, $4, $5, $6)",
                                   holder, key, text, source, wake, list(taint))
                await conn.execute("SELECT pg_notify($1, $2)", EVENTS, holder)
            return holder
        adopted: list[Any] = []  # a dead replica's rows of the session, now run here
        try:
            holder = await self.db.run(go)
        except ClusterUnavailable:
            holder = None
        if holder is None:
            if key not in self.work.held:  # the lane is this replica's now (or an outage)
                await self.work._enter(key)
                self.work.held[key] = asyncio.get_running_loop().time()
            await self.work._start_rows(adopted)
            self._deliver_event(key, text, source, wake, taint)

    async def _claim_events(self) -> None:
        rows = await self.db.run(lambda c: c.fetch(
            "DELETE FROM cluster_events WHERE id IN (SELECT id FROM cluster_events WHERE "
            "target = $1 ORDER BY id FOR UPDATE SKIP LOCKED) RETURNING session_key, text, "
            "source, wake, taint, id", self.me))
        for r in sorted(rows, key=lambda r: r["id"]):
            self._deliver_event(r["session_key"], r["text"], r["source"], r["wake"],
                                tuple(r["taint"] or ()))

    def _lane_holder(self, key: str) -> str | None:
        """The other live replica holding the lane of ``key`` (as of the snapshot)."""
        for rid, info in self.snapshot.items():
            if rid != self.me and info.get("alive") and key in info.get("lanes", []):
                return rid
        return None

    # -- status --------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """``status.problems`` while PostgreSQL is unreachable."""
        st = self.db.status()
        if st["state"] != "down":
            return []
        text = (f"postgres unreachable for {st['down_for_s']}s ({st['last_error']}): "
                "intake and replies wait, nothing is dropped")
        return [text]

    def status(self) -> dict[str, Any]:
        """``status.cluster``: this replica, PostgreSQL's state, and every replica with its
        accounts, lanes and lease age (as of ``snapshot_age_s`` ago)."""
        return {"replica": self.me, "lease_ttl": self.ttl, "postgres": self.db.status(),
                "replicas": self.snapshot,
                "snapshot_age_s": round(time.time() - self.snapshot_at, 1)
                if self.snapshot_at else None,
                "accounts_here": sorted(self.accounts.running) if self.accounts else [],
                "lanes_here": len(self.work.held), "forwarded": self.work.forwarded,
                "claimed": self.work.claimed, "taken_over": self.work.taken_over,
                "turns_answered_elsewhere": self.work.forwarding.forwarded,
                "event_batches_relayed": self.work.forwarding.relayed,
                "heartbeats_handed": self.synthetic.handed, "turns_waited_for_lane":
                self.synthetic.waited,
                "fenced": self.work.fenced}


async def _wait(event: asyncio.Event, timeout: float) -> None:
    """Until ``event`` is set or ``timeout`` seconds pass; clears it."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        pass
    event.clear()
