"""Cron jobs as the outside world writes them (issue 4 "Cron service"; DESIGN.md
"Scheduler"): the request form of a new job, shared by the control API
(``POST /api/cron``), the CLI's offline ``cron add`` and the agent's ``cron`` tool; the
form of an edit (``PATCH /api/cron/{id}``, ``tidegate cron edit``, :func:`edit_fields`);
and :class:`CronToolAccess`, the cron service as that tool sees it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from gateway.routing import Route
from runtime.clock import utc_iso
from scheduler.cron.service import CronJobNotFound, CronService

# The job model (scheduler/cron/job.py) loads with the first job spec or stored job: a
# gateway without cron jobs answers without it (issue 9, cold start).
if TYPE_CHECKING:
    from scheduler.cron.job import CronJob


class SchedulingView(Protocol):
    """What :class:`CronToolAccess` needs of ``gateway.scheduling.wiring.Scheduling`` (declared
    here so the dependency points one way: scheduling -> cron_jobs)."""

    cron: CronService | None
    gw: Any


LAST_REFUSED = ("'last' is no longer accepted (it meant whichever chat spoke most "
                "recently, so one user's job could reach another); name a target "
                "<channel>:<to>[:<thread>], or none")


def job_json(job: CronJob) -> dict[str, Any]:
    """``job`` in its ``jobs.json`` form (``scheduler.cron.job.job_to_dict``) plus where its
    reply goes: ``deliver_to`` (see :func:`deliver_to`) and, for a stored ``last``,
    ``delivery_warning`` (text)."""
    from scheduler.cron.job import delivery_warning, job_to_dict
    out = job_to_dict(job)
    out["deliver_to"] = deliver_to(job)
    warning = delivery_warning(job)
    if warning:
        out["delivery_warning"] = warning
    return out


def deliver_to(job: CronJob) -> str | None:
    """The resolved target of an isolated job as text, ``telegram:42`` (``:<thread>`` when
    there is one, `` (account work)`` off the default account), ``main session`` for a main
    job (its system event wakes the heartbeat, which speaks), or None: nowhere."""
    from scheduler.cron.job import delivery_route
    if job.session_target == "main":
        return "main session"
    route = delivery_route(job)
    if route is None:
        return None
    text = f"{route['channel']}:{route['to']}" + (f":{route['thread']}" if route.get("thread")
                                                   else "")
    account = route.get("account") or "default"
    return text if account == "default" else f"{text} (account {account})"


def parse_schedule(value: Any, now: float) -> dict[str, Any]:
    """The stored form of a job spec's ``schedule`` (DESIGN.md "Scheduler"), accepting:

    - ``{"kind": "cron", "expr": "0 9 * * 1-5", "tz": "Europe/Berlin" | None}``
    - ``{"kind": "every", "interval": 1800 | "30m"}`` (seconds or a duration string)
    - ``{"kind": "at", "at": epoch | "2026-03-01T09:00:00+01:00" | "20m"}`` (relative
      times count from ``now``, epoch seconds; a time in the past is refused)

    Expressions and zones are checked later by ``new_job``. Raises ``ValueError`` naming
    the field.
    """
    from scheduler.cron.job import parse_at, parse_duration
    if not isinstance(value, dict):
        raise ValueError(
            "schedule: must be an object with kind cron, every or at")
    kind = value.get("kind")
    if kind == "cron":
        expr, tz = value.get("expr"), value.get("tz")
        if not isinstance(expr, str) or not expr.strip():
            raise ValueError("schedule.expr: a 5-field crontab expression is required")
        if tz is not None and not isinstance(tz, str):
            raise ValueError(f"schedule.tz: must be an IANA zone name, got {tz!r}")
        return {"kind": "cron", "expr": expr.strip(), "tz": (tz or "").strip() or None}
    if kind == "every":
        try:
            interval = parse_duration(value.get("interval"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"schedule.interval: {exc}") from None
        return {"kind": "every", "interval": interval}
    if kind == "at":
        at = value.get("at")
        if isinstance(at, (int, float)) and not isinstance(at, bool):
            if at < now:
                raise ValueError(f"schedule.at: {utc_iso(at)} is in the past")
            return {"kind": "at", "at": float(at)}
        if not isinstance(at, str) or not at.strip():
            raise ValueError("schedule.at: an RFC 3339 time or a relative time like 20m is "
                             "required")
        try:
            epoch = parse_at(at, now)
        except ValueError as exc:
            raise ValueError(f"schedule.at: {exc}") from None
        if epoch < now:  # a typo would otherwise become a job that is skipped at once
            raise ValueError(f"schedule.at: {at!r} is in the past")
        return {"kind": "at", "at": epoch}
    raise ValueError(f"schedule.kind: must be cron, every or at, got {kind!r}")


def job_from_spec(spec: Any, *, now: float, config: Any,
                  channels: set[str] | None = None,
                  origin: dict[str, Any] | None = None) -> CronJob:
    """A new, validated job from its request form (control API ``POST /api/cron``, the
    CLI's offline ``cron add``, the agent's ``cron`` tool)::

        {name, schedule (see parse_schedule), message, session_target?: main|isolated,
         agent?, delivery?: none|origin|<channel>:<to>[:<thread>], timeout?: s|"10m",
         delete_after_run?: bool, enabled?: bool}

    Defaults: the config's default agent; a cron schedule's ``tz`` is the agent's
    ``user_timezone``; timeout ``cron.timeout`` (main) or
    ``cron.agent_timeout`` (isolated agent turns); delivery ``none`` (main; the heartbeat
    speaks), for isolated jobs ``origin`` when ``origin`` (the route of the chat turn that
    creates the job, ``{channel, account, to, thread}``) is given, else ``none`` (the CLI
    and the control API have no chat: nothing is sent until a target is named);
    ``delete_after_run`` true for ``at`` jobs. ``now`` is epoch seconds. Raises
    ``ValueError`` naming the field (``delivery: 'last' is no longer accepted ...``).
    """
    from scheduler.cron.job import new_job, parse_duration
    if not isinstance(spec, dict):
        raise ValueError("a job must be a JSON object")
    name, message = spec.get("name"), spec.get("message")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("name: required")
    if not isinstance(message, str) or not message.strip():
        raise ValueError("message: required (the text the job sends to the agent)")
    target = spec.get("session_target") or "main"
    if target not in ("main", "isolated"):
        raise ValueError(f"session_target: must be main or isolated, got {target!r}")
    agent = spec.get("agent") or config.default_agent()
    if not isinstance(agent, str) or agent.strip().lower() not in config.agent_ids():
        raise ValueError(f"agent: unknown agent {agent!r} (have: "
                         f"{', '.join(config.agent_ids())})")
    timeout = spec.get("timeout")
    if timeout is None:
        timeout = config.cron.agent_timeout if target == "isolated" else config.cron.timeout
    else:
        try:
            timeout = parse_duration(timeout)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"timeout: {exc}") from None
    delivery = spec.get("delivery")
    if delivery is not None and not isinstance(delivery, str):
        raise ValueError(f"delivery: must be none, origin or <channel>:<to>, got {delivery!r}")
    if delivery and delivery.strip() == "last":
        raise ValueError(f"delivery: {LAST_REFUSED}")
    if delivery and delivery.strip() == "origin" and not origin:
        raise ValueError("delivery: origin: this job is not created from a chat, so there is "
                         "no chat to deliver to; name a target <channel>:<to>[:<thread>]")
    if delivery and delivery.strip() not in ("none", "origin"):
        problem = config.target_problem(delivery.strip(), channels)
        if problem:
            raise ValueError(f"delivery: {problem}")
    for flag in ("delete_after_run", "enabled"):
        if spec.get(flag) is not None and not isinstance(spec.get(flag), bool):
            raise ValueError(f"{flag}: must be true or false, got {spec.get(flag)!r}")
    agent = agent.strip().lower()
    schedule = parse_schedule(spec.get("schedule"), now)
    if schedule["kind"] == "cron" and not schedule["tz"]:
        schedule["tz"] = config.agent(agent).user_timezone  # explicit, and the job's agent's
    return new_job(name=name.strip(), schedule=schedule, message=message, now=now,
                   session_target=target, agent=agent, delivery=(delivery or "").strip() or None,
                   timeout=timeout, delete_after_run=spec.get("delete_after_run"),
                   enabled=spec.get("enabled") is not False, origin=origin)


EDITABLE = frozenset({"name", "schedule", "tz", "message", "session_target", "delivery",
                      "timeout"})


def edit_fields(job: CronJob, patch: Any, *, now: float, config: Any,
                channels: set[str] | None = None) -> dict[str, Any]:
    """The ``CronService.update`` fields of an edit (``PATCH /api/cron/{id}``,
    ``tidegate cron edit``)::

        {name?, schedule? (see parse_schedule), tz? (the zone of a cron schedule, alone or
         with a new one), message?, session_target?: main|isolated,
         delivery?: none|origin|<channel>:<to>[:<thread>], timeout?: s|"10m"}

    Fields left out keep their value. Raises ``ValueError`` naming the field (unknown
    fields too)."""
    if not isinstance(patch, dict) or not patch:
        raise ValueError("an edit must be a non-empty JSON object")
    unknown = set(patch) - EDITABLE
    if unknown:
        raise ValueError(f"{min(unknown)}: cannot be edited (editable: "
                         f"{', '.join(sorted(EDITABLE))})")
    # Validate the merged job through the same rules as a new one (a kept delivery is not
    # judged again: a stored 'last' stays editable until a target replaces it).
    merged = {"name": job.name, "message": job.payload.get("message", ""),
              "session_target": job.session_target, "agent": job.agent,
              "delivery": "none", "timeout": job.timeout,
              **{k: v for k, v in patch.items() if k not in ("schedule", "tz")}}
    schedule = dict(job.schedule)
    if "schedule" in patch:
        schedule = parse_schedule(patch["schedule"], now)
    if "tz" in patch:
        if schedule.get("kind") != "cron":
            raise ValueError("tz: only a cron schedule has a timezone")
        schedule["tz"] = patch["tz"]
    if "schedule" not in patch and "tz" not in patch:
        probe = {"kind": "every", "interval": 60}  # the kept schedule needs no re-parse
    else:
        probe = {k: v for k, v in schedule.items() if k != "anchor"}
        if probe["kind"] == "at":
            probe["at"] = max(float(probe["at"]), now)
    checked = job_from_spec({**merged, "schedule": probe}, now=now, config=config,
                            channels=channels, origin=job.origin)
    fields: dict[str, Any] = {}
    if "name" in patch:
        fields["name"] = checked.name
    if "message" in patch:
        fields["payload"] = {**job.payload, "message": checked.payload["message"]}
    if "session_target" in patch:
        fields["session_target"] = checked.session_target
    if "delivery" in patch:
        fields["delivery"] = checked.delivery
    if "timeout" in patch:
        fields["timeout"] = checked.timeout
    if "schedule" in patch or "tz" in patch:
        if schedule["kind"] == "cron" and not schedule.get("tz"):
            schedule["tz"] = config.agent(job.agent).user_timezone
        fields["schedule"] = schedule
    return fields


class CronToolAccess:
    """The cron service as the agent's ``cron`` tool sees it (``CronAccess`` in
    runtime/tools/cron_tool.py): an agent adds, lists and removes only its own jobs.
    Jobs come back in their ``jobs.json`` form. Raises ``ValueError`` for a bad spec, for
    more than ``max_jobs`` jobs per agent or an ``every`` shorter than ``min_interval``
    seconds (a model cannot schedule itself into a busy loop), and ``RuntimeError`` when
    cron is disabled."""

    max_jobs = 50
    min_interval = 60.0

    def __init__(self, sched: SchedulingView) -> None:
        self._sched = sched

    def _service(self) -> CronService:
        if self._sched.cron is None:
            raise RuntimeError(self._sched.cron_unavailable())
        return self._sched.cron

    async def add(self, agent_id: str, spec: dict[str, Any],
                  scope: Any = None) -> dict[str, Any]:
        """Add a job for ``agent_id``; ``scope`` is the calling turn's ``ToolScope``: in a
        chat turn its ``route`` becomes the job's ``origin`` (an isolated job delivers
        there unless ``delivery`` names a target)."""
        gw, svc = self._sched.gw, self._service()
        route = getattr(scope, "route", None)
        origin = route.as_dict() if isinstance(route, Route) else None
        job = job_from_spec({**spec, "agent": agent_id}, now=gw.clock.time(), config=gw.config,
                            channels={n for n, _ in gw.deliverer.channels}, origin=origin)
        if job.schedule["kind"] == "every" and job.schedule["interval"] < self.min_interval:
            raise ValueError(f"every: at least {self.min_interval:g}s between runs")
        if sum(1 for j in await svc.list() if j.agent == agent_id) >= self.max_jobs:
            raise ValueError(f"you already have {self.max_jobs} jobs; remove some first")
        return job_json(await svc.add(job))

    async def list(self, agent_id: str) -> list[dict[str, Any]]:
        return [job_json(j) for j in await self._service().list() if j.agent == agent_id]

    async def remove(self, agent_id: str, job_id: str) -> bool:
        svc = self._service()
        try:
            job = await svc.get(job_id)
        except CronJobNotFound:
            return False
        if job.agent != agent_id:
            return False  # another agent's job does not exist for this one
        await svc.remove(job_id)
        return True
