"""The cron job store as the CLI sees it when the gateway is not running: the configured
store (files, or PostgreSQL's shared ``cron_jobs``), edited under its lock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.cli.scheduler import CliError
from gateway.config.load import LoadedConfig


def job_store(loaded: LoadedConfig) -> Any:
    """The configured job store (files, or PostgreSQL's shared ``cron_jobs``)."""
    from gateway.service.storage import offline_bridge
    from runtime.storage.postgres.errors import StorageUnavailable
    from scheduler.cron.store import CronStore
    try:
        door = offline_bridge(loaded)
    except StorageUnavailable as exc:
        raise CliError(f"error: {exc}") from None
    if door is None:
        return CronStore(loaded.state_dir / "cron" / "jobs.json")
    from runtime.storage.postgres.cron import PgCronRecords
    return CronStore(records=PgCronRecords(door))


def default_tz(loaded: LoadedConfig) -> str:
    """The zone the cron service uses for jobs without ``schedule.tz``."""
    cfg = loaded.config
    return cfg.agent(cfg.default_agent()).user_timezone


def offline_edit(loaded: LoadedConfig, job_id: str,
                  change: Callable[[Any, list[Any]], Any]) -> dict[str, Any]:
    """Apply ``change(job, jobs)`` under the store's lock; returns the job's JSON form
    (``gateway.scheduling.cron_jobs.job_json``)."""
    from gateway.scheduling.cron_jobs import job_json
    from scheduler.cron.store import CronStoreError
    try:
        with job_store(loaded).transaction() as jobs:
            job = next((j for j in jobs if j.id == job_id), None)
            if job is None:
                raise CliError(f"error: no cron job with id {job_id!r}")
            change(job, jobs)
            return job_json(job)
    except CronStoreError as exc:
        raise CliError(f"error: {exc}") from None


def first_run(job: Any, now: float, tz: str) -> float | None:
    from scheduler.cron.schedule import next_regular_run
    if job.schedule.get("kind") == "at":
        return float(job.schedule["at"])  # as CronService.add: overdue one-shots catch up
    return next_regular_run(job, now, tz)
