"""One cron run's bookkeeping (DESIGN.md "Scheduler", seed 001 §9.4): what ``execute``
reports, the copy of the job a run gets, and how a finished run moves its job on — the
failure streak and its alert, backoff, the next slot, a one-shot disabled or deleted. The
rules are the service's (scheduler/cron/service.py docstring).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from runtime.clock import utc_iso
from scheduler.cron.schedule import backoff_delay, latest_slot, next_regular_run

if TYPE_CHECKING:  # the job model loads with the first job (issue 9, cold start)
    from scheduler.cron.job import CronJob

log = structlog.get_logger(__name__)


@dataclass
class RunOutcome:
    """What ``execute`` reports: ``status`` ok | error | timeout | skipped, an ``error``
    message (None when ok), whether a result was ``delivered`` to a channel, the
    ``session_id`` an isolated run's turn ran in (its transcript, for browsing), its
    ``reply`` text and ``not_delivered``: why the reply went nowhere."""

    status: str
    error: str | None = None
    delivered: bool = False
    session_id: str | None = None
    reply: str | None = None
    not_delivered: str | None = None


def settle(job: CronJob, status: str, error: str | None, *, finished: float,
           due_at: float | None, schedule: dict[str, Any], cancelled: bool,
           tz: str) -> tuple[str | None, bool]:
    """Move ``job`` on after a scheduled (not manual) run that ended with ``status``.

    ``schedule`` is the job's schedule when the run started: when an edit replaced it
    during the run, the edit already set ``next_run_at`` and this run's completion no
    longer applies. Returns (alert text when the failure streak reaches 2, else None;
    True when the job is a one-shot to delete now)."""
    send_alert = False
    if status in ("error", "timeout") and not cancelled:
        job.consecutive_errors += 1
        send_alert = job.consecutive_errors == 2
    elif status == "ok":
        job.consecutive_errors = 0
    if job.schedule != schedule:
        pass  # edited during the run: the new schedule stands as the edit set it
    elif job.schedule.get("kind") == "at":
        if status == "ok" and job.delete_after_run:
            return None, True
        job.enabled, job.next_run_at = False, None
    else:
        after = max(finished, due_at or finished)
        nxt = next_regular_run(job, after, tz)
        if status in ("error", "timeout") and not cancelled:
            nxt = max(nxt, finished + backoff_delay(job.consecutive_errors))
        job.next_run_at = nxt if job.enabled else None  # disabled meanwhile
    if not send_alert:
        return None, False
    return (f"Cron job {job.name or job.id!r} ({job.id}) failed "
            f"{job.consecutive_errors} times in a row: {error}. "
            f"Next attempt at {iso(job.next_run_at) or 'never'}."), False


def due_slot(job: CronJob, now: float, catch_up: float,
             tz: str) -> tuple[float | None, str | None]:
    """Catch-up: all missed slots of an overdue ``job`` collapse into one run, due at the
    latest, if that is at most ``catch_up`` seconds old. Returns (that due time, None), or
    (None, why the run is skipped)."""
    lo = max(job.next_run_at, now - catch_up)
    latest = latest_slot(job, lo, now, tz)
    if latest is None and job.next_run_at >= lo:
        latest = job.next_run_at  # e.g. a backoff retry time, not a regular slot
    if latest is None:
        return None, (f"missed while down since {utc_iso(job.next_run_at)}; "
                      f"no missed run within catch_up={catch_up:g}s")
    if now - job.next_run_at > 1.0:
        log.info("cron_catch_up", job_id=job.id, first_missed=utc_iso(job.next_run_at),
                 latest_missed=utc_iso(latest))
    return latest, None


def skipped(job: CronJob, now: float, reason: str, tz: str) -> dict[str, Any]:
    """Record a skipped slot on ``job`` and move it to its next slot (a one-shot is
    disabled); returns the run-log record."""
    log.warning("cron_run_skipped", job_id=job.id, reason=reason, due_at=iso(job.next_run_at))
    record = {"started_at": utc_iso(now), "finished_at": utc_iso(now), "status": "skipped",
              "error": reason, "duration_ms": 0, "delivered": False,
              "due_at": iso(job.next_run_at), "manual": False}
    job.last_status, job.last_error = "skipped", reason
    if job.schedule.get("kind") == "at":
        job.enabled, job.next_run_at = False, None
    else:
        job.next_run_at = next_regular_run(job, now, tz)
    return record


def overlapped(job_id: str, slot: float, now: float, busy_due: float | None) -> dict[str, Any]:
    """The run-log record of ``slot``, a due time that passed while the run due at
    ``busy_due`` was still in flight (runs of one job never overlap; the finished run moved
    the job past it). Logged here; the job itself is not changed."""
    reason = ("previous run still in progress (the run due at "
              f"{iso(busy_due) or 'a manual run'} ran past this due time)")
    log.warning("cron_run_skipped", job_id=job_id, reason=reason, due_at=utc_iso(slot))
    return {"started_at": utc_iso(now), "finished_at": utc_iso(now), "status": "skipped",
            "error": reason, "duration_ms": 0, "delivered": False, "due_at": utc_iso(slot),
            "manual": False}


def interrupted(job: CronJob, tz: str) -> dict[str, Any]:
    """At start: the run due at ``job.last_due_at`` began but never finished (the daemon
    died). The slot counts as used and failed; returns the run-log record."""
    due = job.last_due_at
    error = f"interrupted: the gateway stopped during the run due at {utc_iso(due)}"
    log.warning("cron_run_interrupted", job_id=job.id, due_at=utc_iso(due))
    job.last_status, job.last_error = "error", error
    if job.schedule.get("kind") == "at":
        job.enabled, job.next_run_at = False, None
    else:
        job.next_run_at = next_regular_run(job, due, tz)
    return {"started_at": utc_iso(due), "finished_at": None, "status": "error",
            "error": error, "duration_ms": None, "delivered": False,
            "due_at": utc_iso(due), "manual": False}


def occurrence(job: CronJob, due_at: float | None) -> CronJob:
    """The copy ``execute`` gets: ``last_due_at`` is the due time this run is for (a
    retried occurrence is older than the job's latest)."""
    run = job.copy()
    if due_at is not None:
        run.last_due_at = due_at
    return run


def iso(epoch: float | None) -> str | None:
    return None if epoch is None else utc_iso(epoch)
