"""The cron service: one timer task that runs due jobs, logs each run and reschedules.

DESIGN.md "Scheduler", seed 001 §9.4. The gateway injects ``execute(job) ->
RunOutcome`` (a ``main`` job enqueues a system event in the main session and wakes the
heartbeat; an ``isolated`` job runs a full turn in ``agent:<agent>:cron:<id>`` and
delivers the result) and ``on_alert(job, text)`` for failure alerts.

Timing: a single task sleeps on the injected clock until the earliest ``next_run_at``
(a heap with lazy deletion, so 10,000 jobs cost O(log n) per change), never longer than
``max_sleep`` (60 s) so a wall-clock step or a suspend is noticed. APScheduler is not used: its
schedulers sleep on the real loop clock (tests could not drive them with ``FakeClock``),
its CronTrigger has other crontab semantics (see ``scheduler/cron/crontab.py``), and the
rules below are ours.

Rules:

- At most once per due time: ``last_due_at`` is persisted *before* a run starts. On
  start, a job whose ``next_run_at <= last_due_at`` was interrupted (the daemon died
  mid-run); the slot is logged as an ``error`` ("interrupted") and not run again.
- Catch-up: when a job is found overdue (after a restart, or a late wake), all missed
  slots collapse into one run, made only when the most recent missed slot is at most
  ``catch_up`` seconds old; otherwise the run is ``skipped`` (logged with the reason) and
  the job waits for its next slot. An overdue ``at`` job that is skipped is disabled.
- A slot that comes due while the job is still running is skipped and logged: during a
  ``run_now`` the timer does it; a scheduled run is off the due queue, so when it ends the
  runner logs the slots it ran past (with replicas, each claimed in the ledger first).
- Failures (status ``error`` or ``timeout``) back off: the next attempt is the later of
  the next regular slot and 30 s / 1 min / 5 min / 15 min / 60 min after the 1st / 2nd /
  3rd / 4th / 5th+ consecutive failure. ``on_alert`` is called when the count reaches 2
  (once per streak); an ``ok`` resets it, ``skipped`` leaves it alone.
- An ``at`` job runs once: after an ``ok`` run with ``delete_after_run`` it is deleted,
  otherwise disabled (a failed one-shot stays visible).
- Each run has a timeout (``job.timeout`` seconds, 0 = none) → status ``timeout``.
- ``stop()`` cancels runs in flight; they are logged as ``error`` ("cancelled") and
  their slot counts as used.

State is written to the store after every change (runs that finish in the same loop
iteration share one write); API calls return after their change is on disk. The jobs,
the due queue and the runs in flight are ``scheduler/cron/table.py``; one run from start
to finish is ``scheduler/cron/runner.py``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from runtime.clock import Clock, sleep_or_wake
from scheduler.cron import crontab, sync
from scheduler.cron.runner import AlertFn, CronRunner, ExecuteFn
from scheduler.cron.runs import RunOutcome, due_slot, interrupted, iso, skipped
from scheduler.cron.schedule import is_slot, next_regular_run
from scheduler.cron.store import CronStore
from scheduler.cron.table import CronJobNotFound, JobTable

if TYPE_CHECKING:  # the job model loads with the first job (issue 9, cold start)
    from scheduler.cron.job import CronJob

log = structlog.get_logger(__name__)

__all__ = ["CronJobBusy", "CronJobNotFound", "CronService", "RunOutcome"]

_UPDATABLE = frozenset({
    "name", "enabled", "schedule", "payload", "session_target", "agent", "delivery",
    "timeout", "delete_after_run",
})


class CronJobBusy(RuntimeError):
    """The job is already running."""


class CronService:
    """Runs the jobs of a :class:`CronStore` on an injectable clock (module docstring).

    ``execute(job)`` gets a copy of the job and returns a :class:`RunOutcome`;
    exceptions become status ``error``. ``on_alert(job, text)`` may be sync or async.
    ``catch_up`` is seconds (see module rules); ``tz_default`` is the IANA zone for cron
    jobs without ``schedule.tz``; ``max_sleep`` caps one timer sleep (seconds) so wall-clock
    steps are noticed. All public methods are coroutines; lookups raise
    :class:`CronJobNotFound`, invalid fields ``ValueError``.
    """

    def __init__(
        self,
        store: CronStore,
        clock: Clock,
        execute: ExecuteFn,
        *,
        catch_up: float = 3600.0,
        on_alert: AlertFn | None = None,
        tz_default: str = "UTC",
        max_sleep: float = 60.0,
    ) -> None:
        crontab.resolve_tz(tz_default)  # fail early on a bad zone
        self._max_sleep = float(max_sleep)
        self._clock, self._catch_up, self._tz = clock, float(catch_up), tz_default
        self._table = JobTable(store, self._poke)
        self._runner = CronRunner(self._table, clock, execute, on_alert, tz_default)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False  # the timer ends at its next pass (a cancel may be lost)

    @property
    def occurrences(self) -> Any:
        """The replicas' occurrence ledger (gateway/cluster/occurrences.py), or None on one
        host: ``claim(job_id, due_at)`` -> None to run here, else who has it."""
        return self._runner.occurrences

    @occurrences.setter
    def occurrences(self, ledger: Any) -> None:
        self._runner.occurrences = ledger

    @property
    def on_run_end(self) -> list:
        """Observers called with ``(job_id, status)`` after each run (metrics)."""
        return self._runner.on_run_end

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Load the store, repair interrupted runs and start the timer task.

        Raises :class:`CronStoreError` when ``jobs.json`` is unreadable.
        """
        if self._task is not None:
            return
        self._wake = asyncio.Event()
        self._stopping = False
        await self._load(self._table.store.load())
        self._task = asyncio.create_task(self._loop(), name="cron-timer")
        log.info("cron_started", jobs=len(self._table.jobs), catch_up=self._catch_up)

    async def stop(self) -> None:
        """Stop the timer and cancel runs in flight (logged as cancelled)."""
        task, self._task = self._task, None
        if task is not None:
            # The flag ends the timer even when the cancel is lost: on Python 3.11
            # asyncio.wait_for returns a result that completes as the cancel arrives (a
            # PostgreSQL jobs write), and the timer then ran on forever, the SIGTERMed
            # gateway never exiting.
            self._stopping = True
            task.cancel()
            self._poke()
            await asyncio.gather(task, return_exceptions=True)
        running = list(self._table.running.values())
        for t in running:
            t.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await self._table.flush()
        await self._table.store.settled()  # queued run-log lines are stored too
        log.info("cron_stopped", cancelled_runs=len(running))

    async def reload(self) -> None:
        """Re-read ``jobs.json`` after an external edit (CLI). Runs in flight continue.

        Raises :class:`CronStoreError` (and keeps the current jobs) when the file is bad.
        """
        await self._load(await asyncio.to_thread(self._table.store.load))
        self._poke()
        log.info("cron_reloaded", jobs=len(self._table.jobs))

    async def sync(self) -> bool:
        """Adopt what other replicas wrote to a shared store (``scheduler.cron.sync``);
        True when a job was added, replaced or dropped. Raises CronStoreError/OSError."""
        await self._table.flush()  # our own pending changes first: the store is then ahead of us
        adopt, gone = sync.plan(self._table.jobs, await asyncio.to_thread(self._table.store.load))
        for job in adopt:
            if job.enabled and job.next_run_at is None:  # e.g. written by an offline CLI
                job.next_run_at = self._first_run(job, self._clock.time())
            self._table.jobs[job.id] = job
            self._table.schedule(job)
        for job_id in gone:
            del self._table.jobs[job_id]
            self._table.due.drop(job_id)
        if adopt or gone:
            log.info("cron_synced", adopted=[j.id for j in adopt], dropped=gone)
        return bool(adopt or gone)

    # -- API -------------------------------------------------------------------------

    async def add(self, job: CronJob) -> CronJob:
        """Add a job (see ``cron_store.new_job``); returns a copy with ``next_run_at`` set."""
        job = job.copy()
        from scheduler.cron.job import validate_job
        validate_job(job)
        if job.id in self._table.jobs:
            raise ValueError(f"id: a job with id {job.id!r} already exists")
        now = self._clock.time()
        job.created_at = job.created_at or now
        job.updated_at = now
        if job.enabled and job.next_run_at is None:
            job.next_run_at = self._first_run(job, now)
        self._table.jobs[job.id] = job
        self._table.dirty.add(job.id)
        try:
            await self._table.save_now()
        except BaseException:
            del self._table.jobs[job.id]  # not on disk: not added
            raise
        self._table.schedule(job)
        log.info("cron_job_added", job_id=job.id, name=job.name,
                 next_run_at=iso(job.next_run_at))
        return job.copy()

    @property
    def tz_default(self) -> str:
        """The IANA zone of cron jobs without ``schedule.tz``."""
        return self._tz

    async def list(self) -> list[CronJob]:
        """Copies of all jobs, in insertion order."""
        return [j.copy() for j in self._table.jobs.values()]

    async def get(self, job_id: str) -> CronJob:
        """A copy of one job."""
        return self._table.get(job_id).copy()

    async def update(self, job_id: str, **fields: Any) -> CronJob:
        """Change definition fields (name, enabled, schedule, payload, session_target, agent,
        delivery, timeout, delete_after_run); a new schedule or enabling recomputes
        ``next_run_at`` from now. Returns the updated copy."""
        job = self._table.get(job_id)
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise ValueError(f"cannot update field(s): {', '.join(sorted(unknown))}")
        new = job.copy()
        for k, v in fields.items():
            setattr(new, k, dict(v) if isinstance(v, dict) else v)
        now = self._clock.time()
        if "schedule" in fields and new.schedule.get("kind") == "every" \
                and new.schedule.get("anchor") is None:
            new.schedule["anchor"] = now + float(new.schedule.get("interval") or 0)
        from scheduler.cron.job import validate_job
        validate_job(new)
        if "schedule" in fields or (new.enabled and not job.enabled):
            new.next_run_at = self._first_run(new, now) if new.enabled else None
            new.consecutive_errors = 0
        if not new.enabled:
            new.next_run_at = None
        new.updated_at = now
        self._table.jobs[job_id] = new
        self._table.dirty.add(job_id)
        try:
            await self._table.save_now()
        except BaseException:
            self._table.jobs[job_id] = job  # not on disk: keep the old definition
            raise
        self._table.schedule(new)
        log.info("cron_job_updated", job_id=job_id, fields=sorted(fields),
                 next_run_at=iso(new.next_run_at))
        return new.copy()

    async def enable(self, job_id: str) -> CronJob:
        """``update(job_id, enabled=True)``."""
        return await self.update(job_id, enabled=True)

    async def disable(self, job_id: str) -> CronJob:
        """``update(job_id, enabled=False)``."""
        return await self.update(job_id, enabled=False)

    async def remove(self, job_id: str) -> None:
        """Delete a job (its run log is kept; a run in flight finishes unrecorded in state)."""
        job = self._table.get(job_id)
        del self._table.jobs[job_id]
        try:
            await self._table.save_now()
        except BaseException:
            self._table.jobs[job_id] = job
            raise
        self._table.due.drop(job_id)
        log.info("cron_job_removed", job_id=job_id)

    async def run_now(self, job_id: str) -> RunOutcome:
        """Run a job immediately, even if disabled, without touching its schedule, error
        count or one-shot state. Raises :class:`CronJobBusy` if it is already running."""
        job = self._table.get(job_id)
        if job_id in self._table.running:
            raise CronJobBusy(f"job {job_id} is already running")
        return await asyncio.shield(self._runner.start(job, due_at=None, manual=True))

    async def runs(self, job_id: str, limit: int = 20) -> list[dict[str, Any]]:
        """The last ``limit`` run-log records of a job, oldest first."""
        return await self._table.store.aread_runs(job_id, limit)

    def status(self) -> dict[str, Any]:
        """``{"jobs", "enabled", "running", "next_run_at"}`` for health/status output."""
        nxt = min((j.next_run_at for j in self._table.jobs.values()
                   if j.enabled and j.next_run_at is not None), default=None)
        return {"jobs": len(self._table.jobs), "running": len(self._table.running),
                "enabled": sum(1 for j in self._table.jobs.values() if j.enabled),
                "next_run_at": iso(nxt)}

    # -- scheduling ------------------------------------------------------------------

    def _first_run(self, job: CronJob, now: float) -> float | None:
        if job.schedule.get("kind") == "at":
            return float(job.schedule["at"])  # overdue one-shots follow the catch-up rule
        return next_regular_run(job, now, self._tz)

    async def _load(self, jobs: list[CronJob]) -> None:
        now = self._clock.time()
        self._table.jobs = {j.id: j for j in jobs}
        self._table.due.clear()
        self._table.dirty = set(self._table.jobs)  # the store re-encodes freshly loaded jobs anyway
        changed = False
        for job in jobs:
            if job.id in self._table.running:
                continue  # its run finishes and reschedules it
            if (job.last_due_at is not None and job.next_run_at is not None
                    and job.next_run_at <= job.last_due_at and self.occurrences is None):
                # (replicas: the occurrence ledger retries a dead replica's run instead)
                self._interrupted(job)
                changed = True
            if job.enabled and job.next_run_at is None:
                job.next_run_at = self._first_run(job, now)
                changed = job.next_run_at is not None or changed
            elif self._rescheduled(job, now):
                changed = True
            self._table.schedule(job, wake=False)
        if changed:
            await self._table.save_now(quiet=True)

    def _rescheduled(self, job: CronJob, now: float) -> bool:
        """A job whose stored ``next_run_at`` is no instant of its schedule (edited while
        the gateway was stopped) gets it recomputed from now, so it never fires on the old
        schedule. A retry time after failures is left alone (it is off-schedule on
        purpose). True when it changed."""
        if not job.enabled or job.next_run_at is None or job.consecutive_errors:
            return False
        try:
            if is_slot(job, job.next_run_at, self._tz):
                return False
            new = self._first_run(job, now)
        except ValueError:
            return False  # an invalid schedule is reported where it runs
        log.warning("cron_schedule_changed", job_id=job.id, old_next_run_at=iso(job.next_run_at),
                    next_run_at=iso(new), reason="next_run_at was computed for another "
                    "schedule (jobs.json edited while the gateway was stopped)")
        job.next_run_at = new
        return True

    def _interrupted(self, job: CronJob) -> None:
        self._table.append_run(job.id, interrupted(job, self._tz))

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _loop(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            self._wake.clear()
            now = self._clock.time()
            due = [self._table.jobs[job_id] for job_id in self._table.due.pop_due(now)]
            if due:
                await self._dispatch(due, now)
            delay = self._max_sleep
            if (at := self._table.due.next_at()) is not None:
                delay = max(0.0, min(delay, at - self._clock.time()))
            await sleep_or_wake(self._clock, self._wake, delay)

    async def _dispatch(self, due: list[CronJob], now: float) -> None:
        """Decide run/skip for each due job, persist ``last_due_at``, then start runs."""
        to_run: list[tuple[CronJob, float]] = []
        for job in due:
            try:
                latest = self._due_slot(job, now)
            except Exception:  # never let one bad job stop the timer; retry it later
                log.exception("cron_dispatch_failed", job_id=job.id)
                job.next_run_at = now + self._max_sleep
                self._table.schedule(job, wake=False)
                continue
            if latest is not None:
                job.last_due_at = latest
                self._table.dirty.add(job.id)
                to_run.append((job, latest))
        if to_run:
            await self._table.save_now(quiet=True)  # last_due_at is on disk before anything runs
        for job, due_at in to_run if not self._stopping else ():
            # the save was awaited: the job may have been removed or started meanwhile
            if self._table.jobs.get(job.id) is job and job.id not in self._table.running:
                self._runner.start(job, due_at=due_at, manual=False,
                                   name=f"cron-run-{job.id}")

    def _due_slot(self, job: CronJob, now: float) -> float | None:
        """The due time to run ``job`` for now, or None after recording a skip."""
        if job.id in self._table.running:
            self._skip(job, now, "previous run still in progress")
            return None
        latest, reason = due_slot(job, now, self._catch_up, self._tz)
        if latest is None:
            self._skip(job, now, reason or "")
        return latest

    def _skip(self, job: CronJob, now: float, reason: str) -> None:
        self._table.append_run(job.id, skipped(job, now, reason, self._tz))
        self._table.dirty.add(job.id)
        self._table.schedule(job, wake=False)
        self._table.save_soon()

    def running_jobs(self) -> list[str]:
        """Ids of the jobs with a run in flight here."""
        return list(self._table.running)

    def retry_occurrence(self, job_id: str, due_at: float) -> bool:
        """Run the occurrence ``due_at`` of ``job_id`` again (it was taken over from a
        replica that died during it). False when the job is unknown or running here."""
        return self._runner.retry(job_id, due_at)
