"""The cron service's job table: the jobs in memory, the timer's due queue, the runs in
flight, and their persistence to the :class:`CronStore` (DESIGN.md "Scheduler").

State is written after every change; changes made in one loop iteration share one write
(:meth:`JobTable.save_soon`). Only the job ids changed since the last write are passed to
the store (``changed``), so a store keeping one row per job rewrites only those.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from scheduler.cron.due import DueQueue
from scheduler.cron.store import CronStore, CronStoreError

if TYPE_CHECKING:  # the job model loads with the first job (issue 9, cold start)
    from scheduler.cron.job import CronJob

log = structlog.get_logger(__name__)


class CronJobNotFound(LookupError):
    """No job with this id."""


class JobTable:
    """``jobs`` (id -> CronJob, insertion order), ``due`` (the timer's queue), ``running``
    (id -> the asyncio task of its run in flight) and ``dirty`` (ids changed since the
    last save). ``wake()`` is called when the earliest due time may have moved."""

    def __init__(self, store: CronStore, wake: Callable[[], None]) -> None:
        self.store = store
        self.jobs: dict[str, CronJob] = {}
        self.due = DueQueue()
        self.running: dict[str, asyncio.Task] = {}
        self.dirty: set[str] = set()
        self._wake = wake
        self._flush_pending = False
        self._writing = asyncio.Lock()
        self._saves: set[asyncio.Task] = set()  # save_soon()'s writes in flight

    def get(self, job_id: str) -> CronJob:
        """The live job (not a copy). Raises :class:`CronJobNotFound`."""
        job = self.jobs.get(job_id)
        if job is None:
            raise CronJobNotFound(f"no cron job with id {job_id!r}")
        return job

    def schedule(self, job: CronJob, wake: bool = True) -> None:
        """Put ``job`` on the due queue at ``next_run_at`` (off it when disabled, unset or
        running: a finished run reschedules its job)."""
        if not job.enabled or job.next_run_at is None or job.id in self.running:
            self.due.drop(job.id)
            return
        self.due.put(job.id, job.next_run_at)
        if wake:
            self._wake()

    def drop(self, job_id: str) -> None:
        """Forget a job (its run log stays in the store)."""
        self.jobs.pop(job_id, None)
        self.due.drop(job_id)

    def append_run(self, job_id: str, record: dict[str, Any]) -> None:
        """Append one run-log line; a write failure is logged, never raised."""
        record = {"job_id": job_id, **record}
        try:
            self.store.append_run(job_id, record)
        except OSError:
            log.exception("cron_run_log_write_failed", job_id=job_id)

    async def save_now(self, quiet: bool = False) -> None:
        """Write all jobs; API callers get the error (OSError, CronStoreError), the timer
        (``quiet``) only logs it and keeps the ids dirty for the next write. Writes run one
        at a time, each taking the state as it is when its turn comes; a PostgreSQL store
        is awaited (``CronStore.asave``), never blocking the loop."""
        async with self._writing:
            self._flush_pending = False
            changed, self.dirty = self.dirty, set()
            try:
                await self.store.asave(list(self.jobs.values()), changed=changed)
            except (OSError, CronStoreError):
                self.dirty |= changed
                if not quiet:
                    raise
                log.exception("cron_store_save_failed", path=str(self.store.path))

    def save_soon(self) -> None:
        """Write at the end of this loop iteration (one write for several changes)."""
        if not self._flush_pending:
            self._flush_pending = True
            task = asyncio.get_running_loop().create_task(self.flush())
            self._saves.add(task)
            task.add_done_callback(self._saves.discard)

    async def flush(self) -> None:
        """Write now if a :meth:`save_soon` is pending, and wait for writes in flight."""
        if self._flush_pending:
            await self.save_now(quiet=True)
        async with self._writing:
            pass
