"""The cluster intake journal: a replica's marks on its ``cluster_work`` rows (issue 15
"Replicas"; README "Replicas").

Every accepted platform message is a ``cluster_work`` row before the adapter acknowledges
it (the ``dedupe`` unique constraint is the cluster-wide exactly-once check). The marks a
turn makes on its rows are the JournalTracker's (gateway/journal/tracking.py), written to
the rows instead of the local file:

- ``started`` before the user message reaches the transcript, ``done`` when the turn
  settles (both batched, gateway/cluster/marks.py);
- a side-effecting tool in the rows' ``tools`` before it runs;
- ``replying`` (with the reply) before a reply is sent, fenced: refused once another
  replica took the rows over.

Where a row runs (the lane lease, forwarding, claims, takeover) is
:class:`gateway.cluster.work.ClusterWork`, which extends this class.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import structlog

from gateway.cluster import commands
from gateway.cluster.db import ClusterDB, ClusterUnavailable
from gateway.cluster.fencing import ACCEPT, LeaseLost, mark_replying
from gateway.cluster.marks import JournalMarks
from gateway.journal.tracking import work_to_dict
from gateway.turns.work import CommandWork, UserWork

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Forwarded:
    """Lane result of a message handed to the replica that runs its session's lane."""

    replica: str


class WorkJournal:
    """Journal (``accept``/``turn_started``/``reply_sending``/``finished``/``tool_began``/
    ``watch``) of one replica's rows. The lane side (``held``: session key -> loop time of
    last activity, ``lane_lost``) is the subclass's."""

    held: dict[str, float]

    def __init__(self, db: ClusterDB, replica: str, *, side_effecting: Any) -> None:
        self.db, self.me = db, replica
        self.side_effecting = side_effecting  # tool name -> bool
        self._runs: dict[str, list[int]] = {}  # run id -> row ids (tool marks)
        self._joining: dict[str, asyncio.Task] = {}  # run id -> a steered row's join
        self._inflight: dict[str, int] = {}  # session key -> accepts being written
        self._fast: set[int] = set()  # rows accepted as running here (lane already held)
        self._tasks: set[asyncio.Task] = set()
        self._marks = JournalMarks(db, replica, self._spawn)  # started / done, batched
        self.fenced = 0
        self.forwarding: Any = None  # gateway/cluster/forwarding.py: waiting callers' rows

    def lane_lost(self, key: str) -> None:  # pragma: no cover - the subclass's
        raise NotImplementedError

    async def accept(self, session_key: str, work: UserWork, dedupe: str | None,
                     mark_seen: Any = None) -> bool:
        """Insert the row (waits out a PostgreSQL outage: the platform keeps the message
        until then); False when ``dedupe`` was accepted before, on any replica (not when
        this accept's own answer was lost after its commit: the retry gets its row)."""
        payload = json.dumps(work_to_dict(work), ensure_ascii=False)
        # Fast path: this replica holds the lane, so the row is running here at once (a
        # lease is only given up by release_idle, which waits for in-flight accepts).
        # Fenced: "running here" only while the lane lease is still this replica's (a
        # paused replica may have lost it); otherwise the row takes the lease path.
        fast = session_key in self.held
        self._inflight[session_key] = self._inflight.get(session_key, 0) + 1
        try:
            row = await self.db.retry(lambda c: c.fetchrow(ACCEPT, session_key, dedupe,
                                                           payload, self.me, fast),
                                      what="intake")
        finally:
            self._inflight[session_key] -= 1
            if not self._inflight[session_key]:
                del self._inflight[session_key]
        if mark_seen is not None:
            await mark_seen()  # keeps this replica's local dedupe file in step
        if row is None:
            return False
        work.journal_id = str(row["id"])
        if row["state"] == "running":
            self._fast.add(row["id"])
        elif fast:
            self.lane_lost(session_key)
        return True

    def turn_started(self, run_id: str, works: list[Any]) -> asyncio.Future | None:
        """Mark the rows started; the future is set once that is committed. The turn
        awaits it before its user message reaches the transcript: a row whose message a
        takeover finds there is always marked started, so it is resumed first (adopt.py
        ``resume_order``), never after a younger row that would answer it too.

        Fenced: the future's result is :class:`Forwarded` when every row was refused,
        i.e. taken over by another replica while this one was paused or cut off (a turn
        queued here before the pause starts after it); that replica runs them, so the
        turn ends here before its model call, with that result. Else None."""
        ids = _ids(works)
        if not ids:
            return None
        known = self._runs.get(run_id, [])
        joined = [i for i in ids if i not in known]
        # A message steered into a running turn joins its rows: later tool and taint
        # marks reach every row of the turn, and the new row takes what already ran
        self._runs[run_id] = [*known, *joined]
        if known and joined:
            self._joining[run_id] = self._spawn(self._join(known[0], joined, run_id))
        marked = self._marks.mark("started", ids, run_id)
        out: asyncio.Future = asyncio.get_running_loop().create_future()

        def settled(f: asyncio.Future) -> None:
            if out.done():
                return
            if f.cancelled():
                out.cancel()
            elif f.exception() is not None:
                out.set_exception(f.exception())  # type: ignore[arg-type]
            elif set(f.result()) == set(ids):
                self.fenced += 1
                log.warning("cluster_turn_fenced", entry_ids=ids, run_id=run_id,
                            replica=self.me, reason="the rows were taken over by another "
                            "replica; its turn answers them, this one does not run")
                out.set_result(Forwarded("another replica"))
            else:
                out.set_result(None)
        marked.add_done_callback(settled)
        return out

    async def reply_sending(self, works: list[Any], text: str, key: str | None, *,
                            stream: bool = False) -> None:
        """Awaited by the turn executor: a takeover must know the reply may have gone.
        Fenced: raises :class:`LeaseLost` (the reply is not sent) when the rows are no
        longer this replica's, i.e. another replica took them over while this one was
        paused or cut off and answers them itself."""
        if ids := _ids(works):
            reply = {"text": text, "key": key, "stream": stream}
            ok = await self.db.retry(lambda c: mark_replying(c, ids, self.me, reply),
                                     what="journal mark")
            if not ok:
                self.fenced += 1
                log.warning("cluster_reply_fenced", entry_ids=ids, replica=self.me,
                            reason="the rows were taken over by another replica; its "
                                   "turn answers them, this reply is not sent")
                raise LeaseLost(f"rows {ids} are no longer run by {self.me}")

    def finished(self, works: list[Any]) -> None:
        self._done(_ids(works))

    def finished_rows(self, ids: list[int]) -> None:
        """Mark rows done (batched) that no turn here finished (already ended elsewhere)."""
        self._done(ids)

    async def tool_began(self, run_id: str, tool: str) -> None:
        """A side-effecting ``tool`` of turn ``run_id`` is about to run (ToolContext
        ``before_side_effect``): it is in the rows' ``tools`` before it runs, so a replica
        taking the rows over continues the turn (system event, notice) and never re-runs
        it blindly. Waits out a PostgreSQL outage like the other marks."""
        ids = self._runs.get(run_id)
        if ids and self.side_effecting(tool):
            await self._joined(run_id)
            # the run id too: the batched started mark may not be written yet
            await self.db.retry(lambda c: c.execute(
                "UPDATE cluster_work SET tools = array_append(tools, $2), run_id = $4 "
                "WHERE id = ANY($1::bigint[]) AND target = $3", ids, tool, self.me, run_id),
                what="journal mark")

    async def tainted(self, run_id: str, why: str) -> None:
        """A tool result tainted turn ``run_id`` (ToolContext ``on_taint``): ``why`` is in
        the rows' ``taint`` before the turn goes on, so the replica re-running them after
        a takeover starts the turn tainted (docs/exec.md "Tainted turns"). Waits out a
        PostgreSQL outage like the other marks."""
        if ids := self._runs.get(run_id):
            await self._joined(run_id)
            await self.db.retry(lambda c: c.execute(
                "UPDATE cluster_work SET taint = array_append(taint, $2) "
                "WHERE id = ANY($1::bigint[]) AND target = $3 AND NOT ($2 = ANY(taint))",
                ids, why, self.me), what="journal mark")

    async def _join(self, first: int, joined: list[int], run_id: str) -> None:
        """Rows ``joined`` (steered in) take the current attempt's tools and the taint of
        row ``first`` (the turn's), as the intake journal's ``started`` does: a takeover
        then charges and resumes them as the turn they joined."""
        await self.db.retry(lambda c: c.execute(_JOIN, first, joined, run_id, self.me),
                            what="journal mark")

    async def _joined(self, run_id: str) -> None:
        """Wait for a steered row's join of ``run_id`` (a later mark lands after it)."""
        task = self._joining.get(run_id)
        if task is not None and not task.done():
            await asyncio.shield(task)

    def watch(self, work: UserWork, fut: asyncio.Future) -> None:
        """Mark the row done when its turn settles here (not when it was forwarded)."""
        if work.journal_id is None:
            return

        def settled(f: asyncio.Future) -> None:
            if not f.cancelled() and not (f.exception() is None
                                          and isinstance(f.result(), Forwarded)):
                row = int(work.journal_id)
                if isinstance(work, CommandWork):  # its outcome first, for the receiver
                    self._spawn(self._command_done(row, f))
                elif self.forwarding is not None and self.forwarding.relaying(row):
                    self._spawn(self._result_done(row, f))  # a caller waits elsewhere
                else:
                    self._done(_ids([work]))
                self._runs.pop(work.run_id, None)
                self._joining.pop(work.run_id, None)

        fut.add_done_callback(settled)

    async def _command_done(self, row_id: int, fut: asyncio.Future) -> None:
        result = fut.result() if fut.exception() is None else None
        try:
            await self.db.retry(lambda c: commands.record_result(c, row_id, self.me, result),
                                what="command result")
        finally:
            self._done([row_id])

    async def _result_done(self, row_id: int, fut: asyncio.Future) -> None:
        try:
            await self.forwarding.finish(row_id, fut)
        finally:
            self._done([row_id])

    def _done(self, ids: list[int]) -> None:
        if ids:
            self._marks.mark("done", ids)

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def pending(self) -> int:
        """Rows not done, cluster-wide; -1 while PostgreSQL is out of reach."""
        try:
            return await self.db.run(lambda c: c.fetchval(
                "SELECT count(*) FROM cluster_work WHERE state <> 'done'"))
        except ClusterUnavailable:
            return -1

    async def close(self) -> None:
        """Wait (up to 5 s) for the marks and callbacks still being written."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)


# $1: the turn's first row, $2: the rows steered into it, $3: its run id, $4: this replica
_JOIN = ("UPDATE cluster_work w SET tools = w.tools || o.tools[o.attempt_from + 1:], "
         "taint = w.taint || ARRAY(SELECT t FROM unnest(o.taint) t "
         "WHERE NOT t = ANY(w.taint)), run_id = $3 "
         "FROM cluster_work o WHERE o.id = $1 AND w.id = ANY($2::bigint[]) AND w.target = $4")


def _ids(works: list[Any]) -> list[int]:
    """The rows of ``works``, a merged album's other parts included (one turn answers
    them all: started, replying and done together)."""
    return [int(i) for w in works if getattr(w, "journal_id", None)
            for i in (w.journal_id, *getattr(w, "album_parts", ()))]
