"""Schedule arithmetic of cron jobs: the next regular run, the latest slot in a window
(for catch-up) and the failure backoff (seed 001 §9.4: 30 s, 1 min, 5 min, 15 min, 60 min).
All times are epoch seconds."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scheduler.cron import crontab

if TYPE_CHECKING:  # the job model loads with the first job (issue 9, cold start)
    from scheduler.cron.job import CronJob

BACKOFF_SCHEDULE = (30.0, 60.0, 300.0, 900.0, 3600.0)  # seconds after 1st..5th+ failure


def backoff_delay(consecutive_errors: int) -> float:
    """Seconds to wait after the n-th consecutive failure (0 for n <= 0)."""
    if consecutive_errors <= 0:
        return 0.0
    return BACKOFF_SCHEDULE[min(consecutive_errors, len(BACKOFF_SCHEDULE)) - 1]


def next_regular_run(job: CronJob, after: float, tz_default: str = "UTC") -> float | None:
    """The job's first scheduled instant strictly after ``after`` (epoch seconds).

    ``cron``: crontab in ``schedule.tz`` (else ``tz_default``); ``every``: anchor +
    k*interval (anchor defaults to created_at + interval); ``at``: the time itself if
    still ahead, else None. Raises ``ValueError`` for an invalid schedule.
    """
    s = job.schedule
    kind = s.get("kind")
    if kind == "cron":
        return crontab.next_fire(s["expr"], after, s.get("tz") or tz_default)
    if kind == "every":
        iv = float(s["interval"])
        anchor = s.get("anchor")
        anchor = job.created_at + iv if anchor is None else float(anchor)
        if after < anchor:
            return anchor
        slot = anchor + (math.floor((after - anchor) / iv) + 1) * iv
        return slot if slot > after else slot + iv
    if kind == "at":
        at = float(s["at"])
        return at if at > after else None
    raise ValueError(f"schedule.kind: unknown {kind!r}")


def is_slot(job: CronJob, t: float, tz_default: str = "UTC") -> bool:
    """Whether ``t`` is one of the job's scheduled instants (its schedule as it is now).
    A stored ``next_run_at`` that is not one was computed for another schedule: the job's
    schedule was edited (``jobs.json`` by hand, an older version) since. Raises
    ``ValueError`` for an invalid schedule."""
    s = job.schedule
    if s.get("kind") == "at":
        return abs(float(s["at"]) - t) < 1e-3
    eps = min(0.5, float(s["interval"]) / 2) if s.get("kind") == "every" else 0.5
    nxt = next_regular_run(job, t - eps, tz_default)
    return nxt is not None and abs(nxt - t) < 1e-3


def latest_slot(job: CronJob, lo: float, hi: float, tz_default: str) -> float | None:
    """The latest scheduled instant in [lo, hi], or None."""
    s = job.schedule
    if s.get("kind") == "every":
        iv = float(s["interval"])
        anchor = s.get("anchor")
        anchor = job.created_at + iv if anchor is None else float(anchor)
        if hi < anchor:
            return None
        slot = anchor + math.floor((hi - anchor) / iv) * iv
        return slot if slot >= lo else None
    if s.get("kind") == "at":
        at = float(s["at"])
        return at if lo <= at <= hi else None
    latest = None
    slot = next_regular_run(job, lo - 1e-3, tz_default)
    while slot is not None and slot <= hi:
        latest = slot
        slot = next_regular_run(job, slot, tz_default)
    return latest


def upcoming_runs(job: CronJob, after: float, n: int, tz_default: str = "UTC") -> list[float]:
    """The job's next ``n`` scheduled instants after ``after`` (epoch seconds, ascending;
    fewer for a one-shot). The regular schedule only: backoff after errors is not applied.
    Raises ``ValueError`` for an invalid schedule."""
    out: list[float] = []
    t = after
    while len(out) < n:
        nxt = next_regular_run(job, t, tz_default)
        if nxt is None:
            break
        out.append(nxt)
        t = nxt
    return out


def slots_between(job: CronJob, lo: float, hi: float, limit: int,
                  tz_default: str = "UTC") -> list[float]:
    """The job's scheduled instants in (``lo``, ``hi``], ascending, at most ``limit`` (the
    earliest). Raises ``ValueError`` for an invalid schedule."""
    return [t for t in upcoming_runs(job, lo, limit, tz_default) if t <= hi]
