"""The cron job store interface: job definitions (with their run state) and each job's
run log (DESIGN.md "Scheduler", seed 001 §9.4).

The job model and its validation belong to the scheduler (``scheduler.cron.job``,
``scheduler.cron.store.CronStore`` encodes and checks); a backend keeps each job as one
JSON text (``job_to_dict`` form), in insertion order, and each run record as one JSON
object. Backends: ``embedded.cron_files`` (``cron/jobs.json`` + ``cron/runs/*.jsonl``)
and ``postgres.cron`` (tables ``cron_jobs`` and ``cron_runs``, shared by every replica).
"""

from __future__ import annotations

from collections.abc import Collection
from contextlib import AbstractContextManager
from typing import Any, Protocol


class CronStoreError(ValueError):
    """The job store (or a job in it) is unreadable or invalid; the message names it."""


class CronRecords(Protocol):
    """Blocking backend API. ``path`` names the store in messages."""

    path: Any

    def lock(self, exclusive: bool) -> AbstractContextManager[None]:
        """Held across a load-modify-save (re-entrant within one store)."""

    def read(self) -> tuple[list[Any], float | None]:
        """(the raw job objects in order, a created_at guess for jobs without one or
        None). Raises CronStoreError when unreadable."""

    def write(self, lines: dict[str, str], changed: Collection[str] | None,
              defined_at: dict[str, float]) -> None:
        """Store exactly the jobs in ``lines`` (id -> JSON text, in order). ``changed``
        names the ids modified since the last write (None: all); ``defined_at`` gives
        each changed job's ``updated_at`` (a shared backend keeps the newer definition).
        Raises CronStoreError (nothing written) or OSError."""

    def append_run(self, job_id: str, record: dict[str, Any]) -> None:
        """Append one run record. Raises OSError."""

    def read_runs(self, job_id: str, limit: int) -> list[dict[str, Any]]:
        """The last ``limit`` run records, oldest first."""
