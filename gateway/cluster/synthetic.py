"""Turns the gateway starts itself on replicas (README "Replicas"): heartbeat beats,
cron runs, system-event turns, subagent runs and announces, ``sessions_send`` — every
:class:`~gateway.turns.work.SyntheticWork` — run under the session's lane lease like a
message, so they never run beside a turn of the same session on another replica.

Before the turn starts here, this replica takes the lane lease (or finds it is already
its own). When another live replica holds it:

- a **heartbeat** beat is handed to that replica (a ``cluster_events`` row of source
  :data:`HEARTBEAT` naming the agent, and ``NOTIFY tidegate_events``): it runs the beat
  on its own lane (skipped there while a turn runs, as on one host) without claiming
  the beat's slot again (this replica claimed it); here the beat is recorded as
  skipped, ``ran on replica <id>``;
- a **system-event turn** (a woken session, a subagent's announce) is handed over the
  same way (source :data:`WAKE`): the holder runs its own system-event turn, which
  drains the events that were handed to it (``enqueue`` sends them to the holder), and
  delivers a real answer to the session's last route;
- any other turn (a cron run, a subagent run, ``sessions_send``) waits until the lane
  is free — the holder gives it back once idle — polling every :data:`POLL` seconds for at most
  :data:`WAIT`, then runs here. So two runs of one cron job due on different replicas
  run one after the other, each due time once (the occurrence ledger).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import structlog

from gateway.cluster import adopt, membership
from gateway.cluster.adopt import Assigned
from gateway.turns.work import SyntheticWork
from runtime.turn import TurnResult

log = structlog.get_logger(__name__)

EVENTS = "tidegate_events"  # the cluster service's NOTIFY channel for handed-over events
HEARTBEAT = "cluster.heartbeat"  # event source: run this agent's heartbeat beat here
WAKE = "cluster.wake"  # event source: run a system-event turn of this session here
# triggers handed to the lane's holder instead of waiting: -> (event source, text)
HANDED = {"heartbeat": lambda w: (HEARTBEAT, w.agent_id),
          "system": lambda w: (WAKE, "handed from another replica")}
NO_ROW = 2**62  # "before" every row: a dead replica's open rows of the session all count
POLL = 0.2  # seconds between attempts at a lane another replica holds
WAIT = 900.0  # seconds a turn waits for such a lane at most


async def take(conn: asyncpg.Connection, work: Any, key: str) -> Assigned:
    """In one transaction: the session's rows a dead replica left go to the lane's
    holder (as for a message), and the lane lease is taken when free (or its holder
    dead). ``work``: the replica's ClusterWork."""
    ttl = work.db.peer_ttl(work.ttl)  # nobody is dead just after an outage
    async with conn.transaction():
        dead = await adopt.lock_dead_rows(conn, key, NO_ROW, work.me, ttl)
        holder, generation = await membership.acquire_fenced(conn, "lane:" + key, work.me,
                                                             ttl)
        adopted = await adopt.hand_over(conn, dead, holder, work.me)
        if holder == work.me:
            work.fences.took(key, generation)
    return Assigned(holder, adopted, dead)


async def hand(conn: asyncpg.Connection, holder: str, key: str, source: str,
               text: str) -> None:
    """Queue a hand-off event (``source`` :data:`HEARTBEAT` or :data:`WAKE`) for
    ``holder`` and wake it."""
    async with conn.transaction():
        await conn.execute("INSERT INTO cluster_events (target, session_key, text, source, "
                           "wake) VALUES ($1, $2, $3, $4, false)", holder, key, text, source)
        await conn.execute("SELECT pg_notify($1, $2)", EVENTS, holder)


class SyntheticTurns:
    """``submit(key, work, kw)`` for ClusterLanes: the future of ``work``'s TurnResult."""

    def __init__(self, work: Any) -> None:
        self.work = work
        self.handed = self.waited = 0  # beats handed over; turns that waited for a lane

    def submit(self, key: str, work: SyntheticWork, kw: dict[str, Any]) -> asyncio.Future:
        out: asyncio.Future = asyncio.get_running_loop().create_future()

        async def run() -> None:
            try:
                holder = await self._lane(key, work)
                if holder is not None:  # handed over: it runs there
                    result = TurnResult(work.run_id, key, "", "skipped" if
                                        work.trigger == "heartbeat" else "ok", "",
                                        error=f"ran on replica {holder}")
                    if work.decide is not None:
                        work.decide(result)
                elif work.still_due is not None and not await work.still_due():
                    # waited for the lane while another replica took the run over
                    log.warning("cluster_turn_dropped", session_key=key, run_id=work.run_id,
                                trigger=work.trigger, reason="taken over by another "
                                "replica while it waited for the lane")
                    result = TurnResult(work.run_id, key, "", "skipped", "",
                                        error="taken over by another replica")
                else:
                    result = await self.work._run_here(key, work, **kw)
            except BaseException as exc:
                if not out.done():
                    out.set_exception(exc) if isinstance(exc, Exception) else out.cancel()
                raise
            if not out.done():
                out.set_result(result)
        self.work._spawn(run())
        return out

    async def _lane(self, key: str, work: SyntheticWork) -> str | None:
        """None once this replica holds the lane of ``key``; the holder's id when a beat
        was handed to it. Raises RuntimeError after :data:`WAIT` seconds."""
        loop = asyncio.get_running_loop()
        deadline, waited = loop.time() + WAIT, False
        while key not in self.work.held:
            got = await self.work.db.retry(lambda c: take(c, self.work, key), what="lane")
            self.work._handed_over(got)
            if got.holder == self.work.me:
                await self.work._enter(key)
                self.work.held[key] = loop.time()
                await self.work._start_rows(got.adopted)  # a dead replica's rows first
                break
            if work.trigger in HANDED:
                source, text = HANDED[work.trigger](work)
                await self.work.db.retry(lambda c, h=got.holder, s=source, t=text: hand(
                    c, h, key, s, t), what="turn hand-off")
                self.handed += 1
                log.info("cluster_heartbeat_handed" if source == HEARTBEAT else
                         "cluster_wake_handed", session_key=key, replica=got.holder)
                return got.holder
            if loop.time() > deadline:
                raise RuntimeError(f"the lane of {key} stayed on replica {got.holder} for "
                                   f"{WAIT:.0f}s")
            if not waited:
                waited, self.waited = True, self.waited + 1
                log.info("cluster_turn_waits_for_lane", session_key=key,
                         replica=got.holder, trigger=work.trigger)
            await asyncio.sleep(POLL)
        self.work._touch(key)
        return None
