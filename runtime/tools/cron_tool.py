"""The ``cron`` tool: the agent adds, lists and removes its own scheduled jobs (issue 4
"Cron service"; seed 001 §9.4).

Arguments: ``{action: add|list|remove, name?, cron?, tz?, every?, at?, message?, session?,
deliver?, id?}``. ``add`` takes exactly one of ``cron`` (5-field crontab, in ``tz`` or the
user's timezone), ``every`` (``30m``, ``2h``) or ``at`` (RFC 3339 or relative like
``20m``), plus ``message`` (what the job tells the agent when it fires). ``session``:
``main`` (default: a system event in the main session that wakes the heartbeat) or
``isolated`` (a separate turn whose reply goes back to the chat the job was created in,
or to ``deliver``: ``<channel>:<to>`` or ``none``; a job made outside a chat turn, e.g. in
a heartbeat, delivers nowhere unless ``deliver`` names a target).

The runtime does not know the cron service: the gateway puts an object implementing
:class:`CronAccess` in ``ToolContext.extra["cron"]`` (gateway/scheduling/wiring.py
``CronToolAccess``). Jobs always belong to the calling agent, and ``list``/``remove`` only
see that agent's jobs.
"""

from __future__ import annotations

from typing import Any, Protocol

from runtime.tools.registry import ToolContext, ToolError, require_str


class CronAccess(Protocol):
    """The cron service, scoped to one agent; jobs in their ``jobs.json`` form
    (``id``, ``name``, ``enabled``, ``schedule``, ``next_run_at`` RFC 3339 UTC, ...).
    ``add`` raises ``ValueError`` naming the bad field."""

    async def add(self, agent_id: str, spec: dict[str, Any],
                  scope: Any = None) -> dict[str, Any]:
        """``scope``: the calling turn's ``ToolContext.scope`` (its chat becomes the job's
        origin)."""
        ...

    async def list(self, agent_id: str) -> list[dict[str, Any]]: ...

    async def remove(self, agent_id: str, job_id: str) -> bool: ...


def _describe(job: dict[str, Any]) -> str:
    s = job.get("schedule") or {}
    if s.get("kind") == "cron":
        when = f"cron '{s.get('expr')}'" + (f" ({s['tz']})" if s.get("tz") else "")
    elif s.get("kind") == "every":
        when = f"every {s.get('interval'):g}s"
    else:
        when = f"once at {s.get('at')}"
    state = "" if job.get("enabled", True) else ", disabled"
    last = f", last run {job['last_status']}" if job.get("last_status") else ""
    return (f"{job.get('id')} \"{job.get('name')}\": {when}, {job.get('session_target')} "
            f"session, delivers to {job.get('deliver_to') or 'nowhere'}, next run "
            f"{job.get('next_run_at') or 'never'}{last}{state}")


def _spec(args: dict[str, Any]) -> dict[str, Any]:
    kinds = [k for k in ("cron", "every", "at") if args.get(k) not in (None, "")]
    if len(kinds) != 1:
        raise ToolError("add needs exactly one of 'cron', 'every' or 'at'")
    kind = kinds[0]
    value = require_str(args, kind)
    if args.get("tz") and kind != "cron":
        raise ToolError("'tz' only applies to 'cron' schedules")
    schedule: dict[str, Any] = {"kind": kind, {"cron": "expr", "every": "interval",
                                               "at": "at"}[kind]: value}
    if kind == "cron" and args.get("tz"):
        schedule["tz"] = require_str(args, "tz")
    message = require_str(args, "message")
    spec: dict[str, Any] = {"name": (args.get("name") or message[:40]).strip(),
                            "schedule": schedule, "message": message,
                            "session_target": args.get("session") or "main"}
    if args.get("deliver"):
        spec["delivery"] = require_str(args, "deliver")
    return spec


async def cron_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    """Handler of the ``cron`` tool (module docstring). Raises ``ToolError``."""
    access: CronAccess | None = ctx.extra.get("cron")
    if access is None:
        raise ToolError("scheduled jobs are not available in this gateway")
    action = require_str(args, "action")
    try:
        if action == "add":
            job = await access.add(ctx.agent_id, _spec(args), scope=ctx.scope)
            return "added " + _describe(job)
        if action == "list":
            jobs = await access.list(ctx.agent_id)
            if not jobs:
                return "no scheduled jobs"
            return "\n".join(_describe(j) for j in jobs)
        if action == "remove":
            job_id = require_str(args, "id")
            if not await access.remove(ctx.agent_id, job_id):
                raise ToolError(f"no job with id {job_id!r} (use action 'list')")
            return f"removed job {job_id}"
    except (ValueError, RuntimeError) as exc:
        raise ToolError(str(exc)) from None
    raise ToolError(f"unknown action {action!r}: use add, list or remove")
