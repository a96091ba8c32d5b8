"""How ``tidegate cron`` prints a job's schedule and its next run."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gateway.cli.output import format_duration
from runtime.clock import parse_iso


def describe(job: dict[str, Any]) -> str:
    s = job.get("schedule") or {}
    if s.get("kind") == "cron":
        return f"cron '{s.get('expr')}'" + (f" {s['tz']}" if s.get("tz") else "")
    if s.get("kind") == "every":
        return f"every {format_duration(float(s.get('interval') or 0))}"
    return f"at {s.get('at')}"


def delivers(job: dict[str, Any]) -> str:
    """Where the job's reply goes, for ``cron add``/``edit``/``list``: ``delivers to
    telegram:42``, ``delivers via the heartbeat (main session)`` or ``delivers nowhere
    (...how to set a target)``; from the job's ``deliver_to`` (API/``job_json`` form)."""
    target = job.get("deliver_to")
    if job.get("session_target") == "main":
        return "delivers via the heartbeat (main session)"
    if target:
        return f"delivers to {target}"
    return (f"delivers nowhere (no target: tidegate cron edit {job.get('id')} "
            f"--to <channel>:<to>)")


def next_local(job: dict[str, Any], tz_default: str) -> str:
    """The job's next run in its own zone (``schedule.tz``, else the user's timezone)."""
    from scheduler.cron.crontab import resolve_tz
    nxt = job.get("next_run_at")
    if not nxt:
        return "-" if job.get("enabled") else "- (disabled)"
    s = job.get("schedule") or {}
    tz = (s.get("tz") if s.get("kind") == "cron" else None) or tz_default
    local = datetime.fromtimestamp(parse_iso(nxt), resolve_tz(tz))
    return local.strftime("%Y-%m-%d %H:%M %Z") + ("" if tz == "UTC" else f" ({tz})")
