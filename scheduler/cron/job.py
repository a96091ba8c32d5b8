"""The cron job model and its JSON form (DESIGN.md "Scheduler"; seed 001 §9.4).

A :class:`CronJob` is kept in memory with epoch-second times and written to ``jobs.json``
with RFC 3339 UTC strings (``job_to_dict`` / ``job_from_dict``); unknown keys are kept in
``CronJob.extra`` and written back unchanged. ``new_job`` fills the defaults and
``validate_job`` names the first bad field. ``parse_at`` and ``parse_duration`` read the
CLI's and API's time arguments. ``delivery_route`` says where a job's reply goes.

Where a reply goes (``delivery``): ``"none"``; ``"origin"`` — the route of the chat turn
that created the job (``origin``; the agent's ``cron`` tool records it); or an explicit
``"<channel>:<to>[:<thread>]"``. ``"last"`` is only read from older stores: it used to mean
"whichever chat spoke most recently", which sent one user's private output to another; it
now means the job's ``origin`` when one is recorded and nowhere otherwise
(``LEGACY_LAST_WARNING``).
"""

from __future__ import annotations

import copy
import functools
import re
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.clock import parse_iso, utc_iso
from runtime.config_types import parse_duration as _parse_duration
from scheduler.cron import crontab

DEFAULT_TIMEOUT_MAIN = 600.0  # seconds; seed 001 §9.4 "普通任务 10 分钟"
DEFAULT_TIMEOUT_ISOLATED = 3600.0  # seconds; seed 001 §9.4 "Agent 回合 60 分钟"
RUN_STATUSES = ("ok", "error", "timeout", "skipped")

_TIME_FIELDS = ("created_at", "updated_at", "next_run_at", "last_run_at", "last_due_at")
LEGACY_LAST_WARNING = (
    "delivery 'last' (from an older version) no longer follows whichever chat spoke most "
    "recently; this job delivers nowhere until a target is set: "
    "tidegate cron edit {id} --to <channel>:<to>")
_DELIVERY_RE = re.compile(r"^[a-z0-9_.-]+:[^:\s]+(:[^\s]+)?$", re.IGNORECASE)


@dataclass(slots=True)
class CronJob:
    """One scheduled job (DESIGN.md "Scheduler"; all times epoch seconds).

    ``schedule`` is ``{"kind": "cron", "expr": str, "tz": str | None}``,
    ``{"kind": "every", "interval": seconds, "anchor": epoch | None}`` (runs at
    anchor + k*interval, k >= 0; anchor defaults to ``created_at + interval``) or
    ``{"kind": "at", "at": epoch}``.
    ``session_target`` is ``"main"`` (system event in the main session + heartbeat wake) or
    ``"isolated"`` (own turn in ``agent:<agent>:cron:<id>``); ``payload`` is
    ``{"message": text}``; ``delivery`` is ``"none"``, ``"origin"``, ``"<channel>:<to>[:<thread>]"``
    or (stored by older versions) ``"last"`` (module docstring); ``origin`` is the route of
    the chat turn that created the job, ``{"channel", "account", "to", "thread"}``, or None
    (created from the CLI or the control API); ``timeout`` is seconds (0 = no limit).
    The remaining fields are run state kept by :class:`scheduler.cron.service.CronService`.
    """

    id: str
    name: str
    schedule: dict[str, Any]
    payload: dict[str, Any]
    enabled: bool = True
    session_target: str = "main"
    agent: str = "main"
    delivery: str = "none"
    timeout: float = DEFAULT_TIMEOUT_MAIN
    delete_after_run: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0
    next_run_at: float | None = None
    last_run_at: float | None = None
    last_status: str | None = None
    last_error: str | None = None
    consecutive_errors: int = 0
    last_due_at: float | None = None
    origin: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def copy(self) -> CronJob:
        """An independent copy (callers get copies, never the service's own objects)."""
        return replace(
            self, schedule=dict(self.schedule), payload=copy.deepcopy(self.payload),
            origin=dict(self.origin) if self.origin else None,
            extra=copy.deepcopy(self.extra) if self.extra else {},
        )


def new_job(
    *,
    name: str,
    schedule: dict[str, Any],
    message: str,
    now: float,
    session_target: str = "main",
    agent: str = "main",
    delivery: str | None = None,
    timeout: float | None = None,
    delete_after_run: bool | None = None,
    enabled: bool = True,
    origin: dict[str, Any] | None = None,
) -> CronJob:
    """Build and validate a new job with defaults filled in.

    Defaults: ``timeout`` 600 s for main jobs, 3600 s for isolated agent turns;
    ``delivery`` "none" for main jobs (the heartbeat delivers); for isolated jobs "origin"
    when ``origin`` (the creating chat's route) is given, else "none";
    ``delete_after_run`` True for ``at`` schedules. Raises ``ValueError`` on bad input.
    """
    schedule = dict(schedule)
    if schedule.get("kind") == "every" and schedule.get("anchor") is None:
        interval = schedule.get("interval")
        if isinstance(interval, (int, float)) and not isinstance(interval, bool):
            schedule["anchor"] = now + interval
    job = CronJob(
        id=uuid.uuid4().hex[:12],
        name=name,
        schedule=schedule,
        payload={"message": message},
        enabled=enabled,
        session_target=session_target,
        agent=agent,
        delivery=delivery if delivery is not None else
        ("origin" if session_target == "isolated" and origin else "none"),
        origin=dict(origin) if origin else None,
        timeout=timeout if timeout is not None else
        (DEFAULT_TIMEOUT_ISOLATED if session_target == "isolated" else DEFAULT_TIMEOUT_MAIN),
        delete_after_run=(schedule.get("kind") == "at") if delete_after_run is None
        else delete_after_run,
        created_at=now,
        updated_at=now,
    )
    validate_job(job)
    return job


def validate_job(job: CronJob) -> None:
    """Check a job's fields; raises ``ValueError`` naming the field (``schedule.expr: ...``)."""
    if not isinstance(job.id, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", job.id):
        raise ValueError(f"id: must be 1-64 letters, digits, '-' or '_', got {job.id!r}")
    if not isinstance(job.name, str):
        raise ValueError("name: must be a string")
    s = job.schedule
    kind = s.get("kind") if isinstance(s, dict) else None
    if kind == "cron":
        try:
            crontab.parse(s.get("expr"))
            if s.get("tz") is not None:
                crontab.resolve_tz(s["tz"])
        except (ValueError, TypeError) as exc:
            raise ValueError(f"schedule: {exc}") from None
    elif kind == "every":
        iv = s.get("interval")
        if isinstance(iv, bool) or not isinstance(iv, (int, float)) or iv < 1:
            raise ValueError(f"schedule.interval: must be >= 1 second, got {iv!r}")
        anchor = s.get("anchor")
        if anchor is not None and not isinstance(anchor, (int, float)):
            raise ValueError(f"schedule.anchor: must be epoch seconds, got {anchor!r}")
    elif kind == "at":
        at = s.get("at")
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            raise ValueError(f"schedule.at: must be epoch seconds, got {at!r}")
    else:
        raise ValueError(f"schedule.kind: must be cron, every or at, got {kind!r}")
    if job.session_target not in ("main", "isolated"):
        raise ValueError(f"session_target: must be main or isolated, got {job.session_target!r}")
    msg = job.payload.get("message") if isinstance(job.payload, dict) else None
    if not isinstance(msg, str) or not msg.strip():
        raise ValueError("payload.message: must be a non-empty string")
    if not isinstance(job.agent, str) or not job.agent:
        raise ValueError("agent: must be a non-empty string")
    o = job.origin
    if o is not None and not (isinstance(o, dict) and isinstance(o.get("channel"), str)
                              and o["channel"] and isinstance(o.get("to"), str) and o["to"]):
        raise ValueError(f"origin: must be a route {{channel, account, to, thread}}, got {o!r}")
    d = job.delivery
    if not isinstance(d, str) or not (d in ("none", "origin", "last") or _DELIVERY_RE.match(d)):
        raise ValueError(f"delivery: must be none, origin or <channel>:<to>[:<thread>], "
                         f"got {d!r}")
    if d == "origin" and o is None:
        raise ValueError("delivery: origin needs the route of the chat that created the job "
                         "(none recorded); name a target <channel>:<to>")
    t = job.timeout
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
        raise ValueError(f"timeout: must be seconds >= 0, got {t!r}")
    if job.last_status is not None and job.last_status not in RUN_STATUSES:
        raise ValueError(f"last_status: must be one of {RUN_STATUSES}, got {job.last_status!r}")


@functools.lru_cache(maxsize=16384)
def _iso_cached(v: float) -> str:
    return utc_iso(v)  # most times repeat on every save (created_at, anchors, next runs)


def _iso(v: float | None) -> str | None:
    return None if v is None else _iso_cached(v)


def _epoch(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return parse_iso(v)
        except ValueError:
            pass
    raise ValueError(f"{where}: not an RFC 3339 time: {v!r}")


def job_to_dict(job: CronJob) -> dict[str, Any]:
    """JSON form of a job (times as RFC 3339 UTC strings)."""
    sched = dict(job.schedule)
    for k in ("at", "anchor"):
        if isinstance(sched.get(k), (int, float)):
            sched[k] = _iso_cached(sched[k])
    out: dict[str, Any] = dict(job.extra)
    out.update(
        id=job.id, name=job.name, enabled=job.enabled, schedule=sched,
        session_target=job.session_target, payload=dict(job.payload), agent=job.agent,
        delivery=job.delivery, timeout=job.timeout, delete_after_run=job.delete_after_run,
        consecutive_errors=job.consecutive_errors, last_status=job.last_status,
        last_error=job.last_error, origin=dict(job.origin) if job.origin else None,
    )
    for name in _TIME_FIELDS:
        out[name] = _iso(getattr(job, name))
    return out


def delivery_route(job: CronJob) -> dict[str, Any] | None:
    """Where an isolated job's reply goes, ``{"channel", "account", "to", "thread"}``, or
    None (nowhere): ``none`` -> None; ``origin`` and a stored ``last`` -> ``job.origin``
    (None when it has none); ``<channel>:<to>[:<thread>]`` -> that chat on the channel's
    default account."""
    d = job.delivery
    if not d or d == "none":
        return None
    if d in ("origin", "last"):
        return dict(job.origin) if job.origin else None
    channel, to, *thread = d.split(":", 2)
    return {"channel": channel, "account": "default", "to": to,
            "thread": thread[0] if thread else None}


def delivery_warning(job: CronJob) -> str | None:
    """The warning ``cron list`` shows for a stored ``last`` without an origin, else None."""
    if job.delivery == "last" and not job.origin:
        return LEGACY_LAST_WARNING.format(id=job.id)
    return None


def job_from_dict(data: dict[str, Any]) -> CronJob:
    """Parse one job object from ``jobs.json``; missing optional fields get defaults.

    Required: ``id``, ``schedule``, ``payload.message``. Raises ``ValueError`` naming the
    field.
    """
    if not isinstance(data, dict):
        raise TypeError("job must be a JSON object")
    if "id" not in data or "schedule" not in data:
        raise ValueError("id and schedule are required")
    sched = dict(data["schedule"]) if isinstance(data["schedule"], dict) else data["schedule"]
    if isinstance(sched, dict):
        for k in ("at", "anchor"):
            if k in sched:
                sched[k] = _epoch(sched[k], f"schedule.{k}")
    target = data.get("session_target", "main")
    timeout = data.get("timeout")
    if timeout is None:
        timeout = DEFAULT_TIMEOUT_ISOLATED if target == "isolated" else DEFAULT_TIMEOUT_MAIN
    known = {"id", "name", "enabled", "schedule", "session_target", "payload", "agent",
             "delivery", "timeout", "delete_after_run", "consecutive_errors", "last_status",
             "last_error", "origin", *_TIME_FIELDS}
    for flag in ("enabled", "delete_after_run"):
        if flag in data and not isinstance(data[flag], bool):
            raise ValueError(f"{flag}: must be true or false, got {data[flag]!r}")
    job = CronJob(
        id=data["id"],
        name=data.get("name") or "",
        schedule=sched,
        payload=data.get("payload") or {},
        enabled=bool(data.get("enabled", True)),
        session_target=target,
        agent=data.get("agent") or "main",
        delivery=data.get("delivery") or "none",
        timeout=timeout,
        delete_after_run=bool(data.get("delete_after_run",
                                       isinstance(sched, dict) and sched.get("kind") == "at")),
        consecutive_errors=int(data.get("consecutive_errors") or 0),
        last_status=data.get("last_status"),
        last_error=data.get("last_error"),
        origin=data.get("origin") or None,
        extra={k: v for k, v in data.items() if k not in known},
    )
    for name in _TIME_FIELDS:
        setattr(job, name, _epoch(data.get(name), name))
    job.created_at = job.created_at or 0.0
    job.updated_at = job.updated_at or job.created_at
    validate_job(job)
    return job


def parse_duration(text: str | float) -> float:
    """Seconds from ``"30s"``, ``"20m"``, ``"2h"``, ``"1d"``, ``"1w"``, ``"1h30m"``, ``"500ms"``
    or a bare number of seconds (the config's duration syntax). Raises ``ValueError`` on
    anything else or a negative value."""
    try:
        return _parse_duration(text)
    except ValueError:
        raise ValueError(f"invalid duration {text!r} (examples: 30s, 20m, 2h, 1d, 1h30m)"
                         ) from None


def parse_at(text: str, now: float) -> float:
    """Epoch seconds for an ``at`` schedule: RFC 3339 (``2026-03-01T09:00:00+01:00``; no
    offset = UTC) or relative to ``now`` (``"20m"``, ``"2h"``, ``"1d"``, ``"30s"``, also
    with a leading ``+``). Raises ``ValueError`` on anything else.
    """
    s = text.strip()
    rel = s.removeprefix("+")
    if rel and rel[0].isdigit() and not re.match(r"\d{4}-", rel):
        return now + parse_duration(rel)
    try:
        return parse_iso(s)
    except ValueError:
        raise ValueError(
            f"invalid time {text!r}: use RFC 3339 (2026-03-01T09:00:00Z) or 20m / 2h / 1d"
        ) from None
