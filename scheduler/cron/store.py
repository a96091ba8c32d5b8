"""The cron job store: encodes and validates jobs (the model is in
``scheduler.cron.job``) over a :class:`runtime.storage.cron.CronRecords` backend.

DESIGN.md "Files on disk" / "Scheduler", seed 001 §9.4. Default backend: the files
``cron/jobs.json`` + ``cron/runs/<job_id>.jsonl`` (``runtime.storage.embedded.cron_files``,
format described there); with ``storage.backend: postgres`` the tables ``cron_jobs`` and
``cron_runs`` (``runtime.storage.postgres.cron``), shared by every replica. A store that
does not parse is never overwritten: loading and saving raise :class:`CronStoreError`
naming it until someone fixes or removes it.

Times are epoch seconds in memory and RFC 3339 UTC strings (``utc_iso``) in JSON,
including ``schedule.at`` and ``schedule.anchor``. Unknown job keys are kept in
``CronJob.extra`` and written back unchanged.

A run record: ``started_at``, ``finished_at`` (RFC 3339), ``status`` (ok | error |
timeout | skipped), ``error``, ``duration_ms``, ``delivered`` (plus ``due_at``,
``manual`` and, for isolated runs, the ``session_id`` the run's turn used).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.storage.cron import CronRecords, CronStoreError
from runtime.storage.embedded.cron_files import CronFiles

if TYPE_CHECKING:  # the job model loads with the first stored job (issue 9, cold start)
    from scheduler.cron.job import CronJob

__all__ = ["CronStore", "CronStoreError"]


class CronStore:
    """Jobs over ``records`` (default: the files at ``path``).

    All methods are blocking (small, fast); ``load``/``save`` take the lock themselves,
    :meth:`transaction` holds it across a load-modify-save (for the CLI). Raises
    :class:`CronStoreError` for an unreadable or invalid store.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 records: CronRecords | None = None) -> None:
        if records is None:
            assert path is not None, "a path or records"
            records = CronFiles(path)
        self.records = records
        self.path = records.path
        self._lines: dict[str, str] = {}  # job id -> its JSON line in the last save

    @property
    def runs_dir(self) -> Path:
        return self.records.runs_dir  # type: ignore[attr-defined]  # files backend only

    def run_log_path(self, job_id: str) -> Path:
        return self.records.run_log_path(job_id)  # type: ignore[attr-defined]

    def _read(self) -> list[CronJob]:
        jobs_raw, created_guess = self.records.read()
        if jobs_raw:  # the job model loads with the first stored job (issue 9, cold start)
            from scheduler.cron.job import job_from_dict
        jobs, seen = [], set()
        for i, item in enumerate(jobs_raw):
            ident = item.get("id") if isinstance(item, dict) else None
            try:
                job = job_from_dict(item)
            except (ValueError, TypeError) as exc:
                raise CronStoreError(f"{self.path}: jobs[{i}] (id {ident!r}): {exc}") from None
            if not job.created_at and created_guess:
                job.created_at = created_guess
                job.updated_at = job.updated_at or job.created_at
            if job.id in seen:
                raise CronStoreError(f"{self.path}: jobs[{i}]: duplicate id {job.id!r}")
            seen.add(job.id)
            jobs.append(job)
        self._lines = {}  # new objects: encode them afresh on the next save
        return jobs

    def load(self) -> list[CronJob]:
        """All jobs in store order (``[]`` when there are none yet)."""
        with self.records.lock(exclusive=False):
            return self._read()

    def save(self, jobs: list[CronJob], changed: Collection[str] | None = None) -> None:
        """Replace the stored jobs with ``jobs`` (atomically).

        ``changed`` (an optimisation for large stores) names the job ids modified since this
        store's previous ``save``; the others reuse their previously encoded line. None
        (default) re-encodes everything. Raises ``CronStoreError`` (and writes nothing) for
        duplicate ids or an invalid job, and when the stored file exists but does not
        parse, so a hand-broken file is never silently replaced.
        """
        lines, fresh = self._encode(jobs, changed)
        self.records.write(lines, None if changed is None else fresh, fresh)
        self._lines = lines

    async def asave(self, jobs: list[CronJob], changed: Collection[str] | None = None
                    ) -> None:
        """:meth:`save` for the event loop: the jobs are encoded at once (a consistent
        snapshot), then a backend that can (PostgreSQL: ``awrite``) is awaited instead of
        blocking the loop; the files are written in place as by ``save``."""
        lines, fresh = self._encode(jobs, changed)
        awrite = getattr(self.records, "awrite", None)
        if awrite is not None:
            await awrite(lines, None if changed is None else fresh, fresh)
        else:
            self.records.write(lines, None if changed is None else fresh, fresh)
        self._lines = lines

    def _encode(self, jobs: list[CronJob], changed: Collection[str] | None
                ) -> tuple[dict[str, str], dict[str, float]]:
        """(job id -> JSON line, job id -> updated_at of the re-encoded ones). Raises
        CronStoreError for duplicate ids or an invalid job."""
        lines: dict[str, str] = {}
        fresh: dict[str, float] = {}
        for j in jobs:
            if j.id in lines:
                raise CronStoreError(f"{self.path}: duplicate job id {j.id!r}; nothing written")
            line = None if changed is None or j.id in changed else self._lines.get(j.id)
            if line is None:
                from scheduler.cron.job import job_to_dict, validate_job
                try:
                    validate_job(j)
                except ValueError as exc:
                    raise CronStoreError(f"{self.path}: job {j.id!r}: {exc}; nothing written") \
                        from None
                # One job per line: readable, diffable, and the fast C encoder.
                line = json.dumps(job_to_dict(j), ensure_ascii=False)
                fresh[j.id] = float(j.updated_at or 0.0)
            lines[j.id] = line
        return lines, fresh

    @contextmanager
    def transaction(self) -> Iterator[list[CronJob]]:
        """Exclusive lock held across load and save: ``with store.transaction() as jobs:``
        mutate the list in place; it is saved when the block exits without an exception.
        """
        with self.records.lock(exclusive=True):
            jobs = self._read()
            yield jobs
            self.save(jobs)

    def append_run(self, job_id: str, record: dict[str, Any]) -> None:
        """Append one run record (one write, no rewrite). Raises OSError."""
        self.records.append_run(job_id, record)

    def read_runs(self, job_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """The last ``limit`` run records, oldest first; torn/invalid lines are skipped."""
        return self.records.read_runs(job_id, limit)

    async def settled(self) -> None:
        """Wait until the run records appended so far are stored (a backend that queues
        them: PostgreSQL; the files are written at once)."""
        settled = getattr(self.records, "settled", None)
        if settled is not None:
            await settled()

    async def aread_runs(self, job_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """:meth:`read_runs` for the event loop (awaited on PostgreSQL)."""
        aread = getattr(self.records, "aread_runs", None)
        if aread is not None:
            return await aread(job_id, limit)
        return self.records.read_runs(job_id, limit)
