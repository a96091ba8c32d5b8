"""The subagent lifecycle (seed 001 §6): spawn -> run on the ``subagent`` lane -> announce
to the requester (retries) -> cleanup; expiries, orphans, kill, restart recovery.

The service does not know lanes, sessions or delivery: a :class:`SubagentHost` (the
gateway) runs the child turn, announces, checks the requester session and records
timeline events. Every state change is written to ``runs.json`` before the next step, so
a restart finds every run: in-flight runs are marked ``interrupted`` and announced,
finished runs not yet announced are announced. A corrupt ``runs.json`` disables only
subagents (one ERROR ``state_file_corrupt`` with owner ``subagents`` and the path, a line
in the gateway's problems); the file is left as it is for the operator.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Protocol

import structlog

from runtime.clock import Clock
from runtime.state_files import report_corrupt
from runtime.subagents.announce import MAX_RETRIES, announce_text, retry_delay
from runtime.subagents.expiry import SWEEP_INTERVAL, announce_expired, hard_expired
from runtime.subagents.records import CorruptRunsFile, RunRecord, RunStore

log = structlog.get_logger(__name__)


class SubagentHost(Protocol):
    """What the service needs from the gateway."""

    async def run_child(self, rec: RunRecord) -> tuple[str, str, str | None]:
        """Run the child turn; ``(status, text, error)`` with status ok|error|timeout|refused|
        killed."""

    def abort_child(self, rec: RunRecord) -> bool: ...

    async def announce(self, rec: RunRecord, text: str) -> bool:
        """Tell the requester session (system event + woken turn + delivery); True when
        it arrived."""

    def requester_alive(self, rec: RunRecord) -> bool: ...

    def delete_child_session(self, rec: RunRecord) -> None: ...

    def record(self, rec: RunRecord, event_type: str, content: dict[str, Any]) -> None: ...

    def park(self, rec: RunRecord, text: str) -> None:
        """Keep an announce that could not be delivered (the outbox)."""


class SubagentError(PermissionError):
    """A spawn was refused (limits, disabled); the message says why."""


class SubagentService:
    """Subagent runs of one gateway (module docstring)."""

    def __init__(self, host: SubagentHost, store: RunStore, clock: Clock,
                 problems: list[str] | None = None) -> None:
        self.host = host
        self.problems = problems
        self.store = store
        self.clock = clock
        self.records: dict[str, RunRecord] = {}
        self.disabled: str | None = None
        self._tasks: dict[str, asyncio.Task] = {}
        self._sweeper: asyncio.Task | None = None

    # -- lifecycle of the service ------------------------------------------------------
    def start(self) -> None:
        """Load runs.json, recover interrupted runs, start the expiry sweeper."""
        try:
            self.records = self.store.load()
        except CorruptRunsFile as exc:
            self.disabled = str(exc)
            report_corrupt("subagents", exc.path, exc.reason, problems=self.problems,
                           effect="subagents are disabled (sessions_spawn refuses)",
                           fix="repair the file or move it away, then restart the gateway")
            return
        now = self.clock.time()
        for rec in self.records.values():
            if rec.active:
                rec.end(now, "interrupted", error="the gateway stopped while it ran")
                log.warning("subagent_interrupted", run_id=rec.run_id,
                            session_key=rec.requester_session_key)
            if rec.announce_state == "pending":
                self._start_task(rec, self._announce(rec))
        self._save()
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())

    async def stop(self) -> None:
        tasks = [*self._tasks.values(), *([self._sweeper] if self._sweeper else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    def _save(self) -> None:
        if self.disabled is None:
            self.store.save(self.records)

    def _start_task(self, rec: RunRecord, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks[rec.run_id] = task
        task.add_done_callback(lambda t, rid=rec.run_id: self._tasks.pop(rid, None)
                               if self._tasks.get(rid) is t else None)

    # -- spawn and run -------------------------------------------------------------------
    def spawn(self, *, requester_key: str, requester_session_id: str, agent_id: str,
              depth: int, max_depth: int, max_children: int, spec: dict[str, Any],
              child_key: Any, extra: dict[str, Any] | None = None) -> RunRecord:
        """Create and start a run; returns its record at once. ``depth`` is the child's
        depth (requester's + 1); ``child_key(agent_id, uuid)`` builds its session key;
        ``extra`` is kept in the record (persisted; e.g. whose memory the run uses).
        Raises SubagentError when disabled or over ``max_depth`` / ``max_children``."""
        if self.disabled is not None:
            raise SubagentError(f"subagents are disabled: {self.disabled}")
        if depth > max_depth:
            raise SubagentError(f"subagent depth limit reached (max_depth {max_depth}): "
                                f"do the task yourself")
        active = [r for r in self.records.values()
                  if r.requester_session_key == requester_key and r.active]
        if len(active) >= max_children:
            raise SubagentError(f"this session already has {len(active)} running subagents "
                                f"(max_children {max_children}); wait for one to finish")
        uid = uuid.uuid4().hex
        rec = RunRecord(run_id=uid[:12], child_session_key=child_key(agent_id, uid),
                        requester_session_key=requester_key,
                        requester_session_id=requester_session_id, agent_id=agent_id,
                        task=spec["task"], created_at=self.clock.time(),
                        label=spec.get("label"), cleanup=spec.get("cleanup", "keep"),
                        model=spec.get("model"), timeout=spec.get("timeout"), depth=depth,
                        extra=dict(extra or {}))
        self.records[rec.run_id] = rec
        self._save()
        self.host.record(rec, "SUBAGENT_SPAWN", {
            "run_id": rec.run_id, "child_session_key": rec.child_session_key,
            "task": rec.task, "label": rec.label, "cleanup": rec.cleanup})
        log.info("subagent_spawned", run_id=rec.run_id, session_key=requester_key,
                 child_session_key=rec.child_session_key, depth=depth)
        self._start_task(rec, self._lifecycle(rec))
        return rec

    async def _lifecycle(self, rec: RunRecord) -> None:
        rec.started_at = self.clock.time()
        self._save()
        try:
            status, text, error = await self.host.run_child(rec)
        except Exception as exc:
            log.exception("subagent_run_failed", run_id=rec.run_id)
            status, text, error = "error", "", str(exc)
        rec.end(self.clock.time(), status, text=text, error=error)
        self._save()
        log.info("subagent_ended", run_id=rec.run_id, status=rec.status,
                 session_key=rec.requester_session_key)
        await self._announce(rec)

    # -- announce ------------------------------------------------------------------------
    async def _announce(self, rec: RunRecord) -> None:
        text = announce_text(rec)
        while rec.announce_state == "pending":
            if not self.host.requester_alive(rec):
                self._orphan(rec)
                return
            if announce_expired(rec, self.clock.time()):
                self._give_up(rec, "expired", text)
                return
            try:
                ok = await self.host.announce(rec, text)
            except Exception:
                log.exception("subagent_announce_error", run_id=rec.run_id)
                ok = False
            if ok:
                self._announced(rec)
                return
            if rec.announce_retry_count >= MAX_RETRIES:
                self._give_up(rec, "failed", text)
                return
            rec.announce_retry_count += 1
            self._save()
            delay = retry_delay(rec.announce_retry_count)
            log.warning("subagent_announce_retry", run_id=rec.run_id,
                        retry=rec.announce_retry_count, delay_s=delay,
                        session_key=rec.requester_session_key)
            await self.clock.sleep(delay)

    def _announced(self, rec: RunRecord) -> None:
        rec.announce_state, rec.announced_at = "announced", self.clock.time()
        self._save()
        self.host.record(rec, "SUBAGENT_ANNOUNCE", {
            "run_id": rec.run_id, "status": rec.status,
            "retries": rec.announce_retry_count})
        log.info("subagent_announced", run_id=rec.run_id, status=rec.status,
                 session_key=rec.requester_session_key, retries=rec.announce_retry_count)
        self._cleanup(rec)

    def _give_up(self, rec: RunRecord, state: str, text: str) -> None:
        rec.announce_state = state
        self._save()
        self.host.park(rec, text)
        log.error("subagent_announce_" + state, run_id=rec.run_id,
                  session_key=rec.requester_session_key, retries=rec.announce_retry_count)
        self._cleanup(rec)

    def _orphan(self, rec: RunRecord) -> None:
        if rec.active:
            self.host.abort_child(rec)
        rec.end(self.clock.time(), "error", error="orphaned: the requester session ended")
        if rec.outcome and rec.outcome.get("status") != "error":
            rec.outcome = {**rec.outcome, "status": "error",
                           "error": "orphaned: the requester session ended"}
        rec.announce_state = "skipped"
        self._save()
        log.warning("subagent_orphaned", run_id=rec.run_id,
                    session_key=rec.requester_session_key)
        self._cleanup(rec)

    def _cleanup(self, rec: RunRecord) -> None:
        if rec.cleanup == "delete":
            self.host.delete_child_session(rec)

    # -- expiry, kill --------------------------------------------------------------------
    async def _sweep_loop(self) -> None:
        while True:
            await self.clock.sleep(SWEEP_INTERVAL)
            try:
                self.sweep()
            except Exception:
                log.exception("subagent_sweep_failed")

    def sweep(self) -> None:
        """Hard-expire runs older than 30 min, orphan runs whose requester is gone,
        expire announces older than 5 min (seed 001 §6)."""
        now = self.clock.time()
        for rec in list(self.records.values()):
            if rec.active and not self.host.requester_alive(rec):
                self._orphan(rec)
            elif hard_expired(rec, now):
                self.host.abort_child(rec)
                rec.end(now, "timeout", error="hard expiry: running for 30 minutes")
                self._save()
                log.error("subagent_hard_expired", run_id=rec.run_id,
                          session_key=rec.requester_session_key)
            elif announce_expired(rec, now):
                task = self._tasks.get(rec.run_id)
                if task is not None:
                    task.cancel()
                self._give_up(rec, "expired", announce_text(rec))

    def kill(self, run_id: str) -> RunRecord:
        """Abort a running child (its outcome becomes ``killed`` and is announced).
        Raises KeyError for an unknown run."""
        rec = self.records[run_id]
        if rec.active and not self.host.abort_child(rec):
            rec.end(self.clock.time(), "killed", error="killed before it started")
            self._save()
        log.info("subagent_kill", run_id=run_id, session_key=rec.requester_session_key)
        return rec

    # -- queries -------------------------------------------------------------------------
    def get(self, run_id: str) -> RunRecord | None:
        return self.records.get(run_id)

    def runs_of(self, requester_key: str) -> list[RunRecord]:
        """The session's runs: on shared storage every replica's (a blocking read; this
        gateway's own runs alone when PostgreSQL cannot be read)."""
        shared: list[RunRecord] = []
        if self.store.shared:
            try:
                shared = self.store.of(requester_key)
            except CorruptRunsFile as exc:
                log.warning("subagent_runs_unreadable", error=exc.reason)
        mine = [r for r in self.records.values() if r.requester_session_key == requester_key]
        return self.merged(shared, mine)

    def merged(self, shared: list[RunRecord], mine: list[RunRecord] | None = None
               ) -> list[RunRecord]:
        """``shared`` (read from the store: every replica's) with this gateway's records
        (``mine``, default all) in place of their stored copies, which may lag."""
        out = {r.run_id: r for r in shared}
        for rec in self.records.values() if mine is None else mine:
            rec.replica = rec.replica or getattr(out.get(rec.run_id), "replica", None)
            out[rec.run_id] = rec
        return list(out.values())
