"""One cron run from start to finish (DESIGN.md "Scheduler", seed 001 §9.4): claim the
occurrence when replicas share the jobs, call ``execute`` under the job's timeout, write
the run-log line, move the job on (``runs.settle``) and send the failure alert.

The rules are the service's (scheduler/cron/service.py docstring); the jobs, the due
queue and the runs in flight are the shared :class:`~scheduler.cron.table.JobTable`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog

from runtime.clock import Clock, maybe_timeout, utc_iso
from scheduler.cron.runs import RunOutcome, iso, occurrence, overlapped, settle
from scheduler.cron.schedule import next_regular_run, slots_between
from scheduler.cron.table import JobTable

if TYPE_CHECKING:  # the job model loads with the first job (issue 9, cold start)
    from scheduler.cron.job import CronJob

log = structlog.get_logger(__name__)

MAX_OVERLAPPED = 100  # due times passed during one run recorded one by one (then a count)

ExecuteFn = Callable[["CronJob"], Awaitable[RunOutcome]]
AlertFn = Callable[["CronJob", str], Awaitable[None] | None]


class CronRunner:
    """Starts and finishes runs of the jobs in ``table``.

    ``occurrences`` (replicas, gateway/cluster/occurrences.py): ``claim(job_id, due_at)``
    -> None to run the occurrence here, else who has it; ``finished(job_id, due_at,
    status)``. ``on_run_end`` observers get ``(job_id, status)`` after each run."""

    def __init__(self, table: JobTable, clock: Clock, execute: ExecuteFn,
                 on_alert: AlertFn | None, tz: str) -> None:
        self._table, self._clock, self._execute = table, clock, execute
        self._on_alert, self._tz = on_alert, tz
        self.occurrences: Any = None
        self.on_run_end: list[Callable[[str, str], None]] = []

    def start(self, job: CronJob, *, due_at: float | None, manual: bool,
              name: str | None = None, retry: bool = False) -> asyncio.Task:
        """Start a run of ``job`` as a task registered in ``table.running``."""
        task = asyncio.create_task(self.run(job, due_at=due_at, manual=manual, retry=retry),
                                   name=name)
        self._table.running[job.id] = task
        return task

    async def run(self, job: CronJob, *, due_at: float | None, manual: bool,
                  retry: bool = False) -> RunOutcome:
        """One run; ``due_at`` None for a manual run; ``retry``: an occurrence taken over
        from a dead replica (older than the job's latest due time). Returns its
        :class:`RunOutcome`; a cancellation is recorded as an ``error`` run and re-raised.
        Due times that passed while it ran are recorded ``skipped`` (``_skip_passed``)."""
        started, t0 = self._clock.time(), self._clock.monotonic()
        schedule = dict(job.schedule)  # the schedule this run belongs to
        gate = self.occurrences if not manual and due_at is not None else None
        alert = None
        try:
            if gate is not None and (holder := await gate.claim(job.id, due_at)) is not None:
                elsewhere = self._ran_elsewhere(job, due_at, holder)
                # due times this timer jumps over (it ran late: a pause, an outage) are
                # claimed and logged skipped, never lost without a record
                await self._skip_passed(job.id, self._passed(job.id, due_at, schedule),
                                        due_at, gate)
                return elsewhere
            log.info("cron_run_start", job_id=job.id, manual=manual, name=job.name,
                     session_target=job.session_target, due_at=iso(due_at))
            try:
                outcome = await self._execute_once(job, due_at)
            except asyncio.CancelledError:
                outcome = RunOutcome("error", "cancelled: the cron service stopped during the run")
                self._finish(job.id, outcome, started, t0, due_at, manual, schedule,
                             cancelled=True)
                raise
            alert = self._finish(job.id, outcome, started, t0, due_at, manual, schedule)
            # (a retry began after its due time: the slots before it were this replica's
            # timer's to decide, not passed during the run)
            passed = [] if manual or due_at is None else \
                self._passed(job.id, max(due_at, started) if retry else due_at, schedule)
            if gate is not None:
                await gate.finished(job.id, due_at, outcome.status)
            await self._skip_passed(job.id, passed, due_at, gate)
        finally:
            self._release(job.id)
        if alert is not None:
            await self._alert(job, alert)
        return outcome

    async def _execute_once(self, job: CronJob, due_at: float | None) -> RunOutcome:
        """``execute`` under the job's timeout; failures become ``error``/``timeout``."""
        try:
            async with maybe_timeout(self._clock, job.timeout):
                outcome = await self._execute(occurrence(job, due_at))
        except TimeoutError:
            return RunOutcome("timeout", f"run exceeded its timeout of {job.timeout:g}s")
        except Exception as exc:  # any failure of the job is a run error
            log.warning("cron_run_exception", job_id=job.id, exc_info=True)
            return RunOutcome("error", f"{type(exc).__name__}: {exc}")
        if not isinstance(outcome, RunOutcome):
            return RunOutcome("error", f"execute returned {outcome!r}, not RunOutcome")
        return outcome

    def _release(self, job_id: str) -> None:
        table = self._table
        if table.running.get(job_id) is asyncio.current_task():
            del table.running[job_id]
            current = table.jobs.get(job_id)
            if current is not None:  # a slot skipped meanwhile left it off the queue
                table.schedule(current)

    async def _alert(self, job: CronJob, text: str) -> None:
        if self._on_alert is None:
            return
        current = self._table.jobs.get(job.id) or job
        try:
            value = self._on_alert(current.copy(), text)
            if inspect.isawaitable(value):
                await value
            log.info("cron_alert_sent", job_id=job.id,
                     consecutive_errors=current.consecutive_errors)
        except Exception:  # a failing alert channel must not stop cron
            log.exception("cron_alert_failed", job_id=job.id)

    def _finish(self, job_id: str, outcome: RunOutcome, started: float, t0: float,
                due_at: float | None, manual: bool, schedule: dict[str, Any],
                cancelled: bool = False) -> str | None:
        """Write the run-log line and update state; returns alert text when one is due.

        ``schedule`` is the job's schedule when the run started: when an edit replaced it
        during the run, the edit already set ``next_run_at`` and this run's completion
        (a one-shot "fired", the next slot of the old schedule) no longer applies."""
        finished = self._clock.time()
        duration_ms = round((self._clock.monotonic() - t0) * 1000)
        status = outcome.status if outcome.status in ("ok", "error", "timeout", "skipped") \
            else "error"
        error = outcome.error if status != "ok" else None
        self._table.append_run(job_id, {
            "started_at": utc_iso(started), "finished_at": utc_iso(finished), "status": status,
            "error": error, "duration_ms": duration_ms, "delivered": bool(outcome.delivered),
            "due_at": iso(due_at), "manual": manual, "session_id": outcome.session_id,
        })
        for observe in self.on_run_end:
            observe(job_id, status)
        (log.info if status in ("ok", "skipped") else log.warning)(
            "cron_run_end", job_id=job_id, manual=manual, status=status, error=error,
            duration_ms=duration_ms, delivered=bool(outcome.delivered),
            session_id=outcome.session_id)
        job = self._table.jobs.get(job_id)
        if job is None:  # removed while running
            return None
        job.last_run_at, job.last_status, job.last_error = started, status, error
        self._table.dirty.add(job_id)
        alert = None
        if not manual:
            alert, delete = settle(job, status, error, finished=finished, due_at=due_at,
                                   schedule=schedule, cancelled=cancelled, tz=self._tz)
            if delete:
                self._table.drop(job_id)
                log.info("cron_job_deleted_after_run", job_id=job_id)
        self._table.save_soon()
        return alert

    def _passed(self, job_id: str, since: float, schedule: dict[str, Any]) -> list[float]:
        """Regular due times of ``job_id`` in (``since``, now], just after its run settled:
        the job sat off the due queue while running and ``settle`` moved it to the first
        slot after the run, so these were never dispatched. Empty when the job is gone, a
        one-shot, or was edited during the run (the edit rescheduled it)."""
        job = self._table.jobs.get(job_id)
        if job is None or job.schedule != schedule or schedule.get("kind") == "at":
            return []
        hi = self._clock.time()
        if job.next_run_at is not None:  # never the slot the timer dispatches next
            hi = min(hi, job.next_run_at - 1e-6)
        try:
            return slots_between(job, since, hi, MAX_OVERLAPPED + 1, self._tz)
        except ValueError:
            return []  # an invalid schedule is reported where it runs

    async def _skip_passed(self, job_id: str, slots: list[float], busy_due: float | None,
                           gate: Any) -> None:
        """Record each due time in ``slots`` as ``skipped`` ("previous run still in
        progress"), as the timer does for a slot due during a manual run, so ``cron runs``
        shows it. With replicas, each is claimed in the occurrence ledger first: one that
        another replica claimed is its to run (its turn waits for the lane) and not
        recorded here."""
        if len(slots) > MAX_OVERLAPPED:
            log.warning("cron_runs_skipped_not_logged", job_id=job_id,
                        reason="previous run still in progress",
                        after=iso(slots[MAX_OVERLAPPED - 1]))
            slots = slots[:MAX_OVERLAPPED]
        for slot in slots:
            if gate is not None and await gate.claim(job_id, slot) is not None:
                continue
            self._table.append_run(job_id, overlapped(job_id, slot, self._clock.time(),
                                                      busy_due))
            if gate is not None:
                await gate.finished(job_id, slot, "skipped")

    def _ran_elsewhere(self, job: CronJob, due_at: float, holder: str) -> RunOutcome:
        """Another replica claimed this occurrence: move on to the next slot, no run-log
        line here (the claiming replica writes it)."""
        log.info("cron_occurrence_elsewhere", job_id=job.id, due_at=iso(due_at),
                 replica=holder)
        if job.schedule.get("kind") == "at":
            job.enabled, job.next_run_at = False, None
        else:
            job.next_run_at = next_regular_run(job, max(due_at, self._clock.time()), self._tz)
        self._table.dirty.add(job.id)
        self._table.save_soon()
        return RunOutcome("skipped", f"due time claimed by replica {holder}")

    def retry(self, job_id: str, due_at: float) -> bool:
        """Run the occurrence ``due_at`` of ``job_id`` again (taken over from a replica that
        died during it). False when the job is unknown or running here."""
        job = self._table.jobs.get(job_id)
        if job is None or job_id in self._table.running:
            return False
        self._table.due.drop(job_id)
        self.start(job, due_at=due_at, manual=False, name=f"cron-retry-{job_id}", retry=True)
        return True
