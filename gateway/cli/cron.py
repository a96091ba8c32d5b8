"""``tidegate cron`` (issue 4; DESIGN.md "Scheduler", seed 001 §9.3-9.4).

The commands go through the running gateway's control API (``/api/cron...``, see
gateway/server/scheduler_api.py), because the daemon owns the job store while it runs and
would write its in-memory copy over any outside edit. When the gateway is not running they
work on the store directly, inside ``CronStore.transaction()`` (an exclusive lock across
read-modify-write, atomic replace), and the daemon picks the jobs up when it starts. ``cron
run`` needs the gateway.

Exit codes: 0 ok, 1 failure (gateway needed but down, unknown job, API error), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gateway.cli.output import format_duration, print_json
from gateway.cli.scheduler import CliError, call_api, running_client
from gateway.config.load import LoadedConfig
from runtime.clock import SYSTEM_CLOCK, parse_iso

RUN_TIMEOUT_S = 4000.0  # `cron run` waits for the run (isolated turns may take 60 min)


def register(sub: Any) -> None:
    """Add ``cron`` to the CLI's subparsers (gateway/cli/main.py)."""
    c = sub.add_parser("cron", help="scheduled jobs: add, edit, list, run, enable/disable, "
                       "remove")
    csub = c.add_subparsers(dest="cron_cmd", required=True, metavar="ACTION")
    add = csub.add_parser("add", help="add a job")
    add.add_argument("--name", required=True, help="a name for the job")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="5-field crontab, e.g. '0 9 * * 1-5'")
    when.add_argument("--every", metavar="DUR", help="interval, e.g. 30m, 2h, 1d")
    when.add_argument("--at", metavar="WHEN", help="one shot: RFC 3339 time or e.g. 20m")
    add.add_argument("--tz", help="IANA zone of --cron (default: the agent's user_timezone)")
    add.add_argument("--message", required=True, help="what the job tells the agent")
    add.add_argument("--session", choices=["main", "isolated"], default="main",
                     help="main: system event in the main session + heartbeat wake; "
                          "isolated: its own turn in agent:<agent>:cron:<id>")
    add.add_argument("--agent", help="agent that runs the job (default: the first agent)")
    add.add_argument("--deliver", metavar="TARGET",
                     help="none | last | <channel>:<to>[:<thread>]")
    add.add_argument("--timeout", metavar="DUR", help="run timeout (default 10m / 60m)")
    add.add_argument("--keep", action="store_true",
                     help="keep an --at job (disabled) after it ran instead of deleting it")
    add.add_argument("--json", action="store_true")
    _add_edit(csub)
    ls = csub.add_parser("list", help="list jobs")
    ls.add_argument("--json", action="store_true")
    for name, text in (("run", "run a job now (needs the gateway)"), ("enable", "enable a job"),
                       ("disable", "disable a job"), ("rm", "remove a job")):
        one = csub.add_parser(name, help=text)
        one.add_argument("id", metavar="ID", help="the job id (`tidegate cron list`)")
        one.add_argument("--json", action="store_true")
    runs = csub.add_parser("runs", help="a job's run log")
    runs.add_argument("id", metavar="ID", help="the job id (`tidegate cron list`)")
    runs.add_argument("--limit", type=int, default=20, help="newest N runs (default 20)")
    runs.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_cron)


def _add_edit(csub: Any) -> None:
    """``cron edit ID``: every field of ``cron add`` becomes optional."""
    ed = csub.add_parser("edit", help="change a job (the running gateway applies it at once)")
    ed.add_argument("id", metavar="ID", help="the job id (`tidegate cron list`)")
    ed.add_argument("--name", help="a new name")
    new_when = ed.add_mutually_exclusive_group()
    new_when.add_argument("--schedule", "--cron", dest="cron", metavar="EXPR",
                          help="new 5-field crontab")
    new_when.add_argument("--every", metavar="DUR", help="new interval")
    new_when.add_argument("--at", metavar="WHEN", help="new one-shot time")
    ed.add_argument("--tz", help="IANA zone of the (new or current) crontab schedule")
    ed.add_argument("--message", help="new text the job tells the agent")
    ed.add_argument("--session", choices=["main", "isolated"],
                    help="main: system event + heartbeat wake; isolated: its own turn")
    ed.add_argument("--deliver", metavar="TARGET", help="none | last | <channel>:<to>[:<thread>]")
    ed.add_argument("--timeout", metavar="DUR", help="new run timeout, e.g. 10m")
    ed.add_argument("--json", action="store_true")


# -- the store -------------------------------------------------------------------------

def _store(loaded: LoadedConfig) -> Any:
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


def _tz_default(loaded: LoadedConfig) -> str:
    """The zone the cron service uses for jobs without ``schedule.tz``."""
    cfg = loaded.config
    return cfg.agent(cfg.default_agent()).user_timezone


def _offline_edit(loaded: LoadedConfig, job_id: str,
                  change: Callable[[Any, list[Any]], Any]) -> dict[str, Any]:
    """Apply ``change(job, jobs)`` under the store's lock; returns the job's JSON form."""
    from scheduler.cron.job import job_to_dict
    from scheduler.cron.store import CronStoreError
    try:
        with _store(loaded).transaction() as jobs:
            job = next((j for j in jobs if j.id == job_id), None)
            if job is None:
                raise CliError(f"error: no cron job with id {job_id!r}")
            change(job, jobs)
            return job_to_dict(job)
    except CronStoreError as exc:
        raise CliError(f"error: {exc}") from None


def _first_run(job: Any, now: float, tz: str) -> float | None:
    from scheduler.cron.schedule import next_regular_run
    if job.schedule.get("kind") == "at":
        return float(job.schedule["at"])  # as CronService.add: overdue one-shots catch up
    return next_regular_run(job, now, tz)


# -- cron ------------------------------------------------------------------------------

def cmd_cron(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    try:
        return _CRON[args.cron_cmd](args, loaded)
    except CliError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    if args.tz and not args.cron:
        raise CliError("error: --tz only applies to --cron", 2)
    if args.cron:
        schedule: dict[str, Any] = {"kind": "cron", "expr": args.cron, "tz": args.tz}
    elif args.every:
        schedule = {"kind": "every", "interval": args.every}
    else:
        schedule = {"kind": "at", "at": args.at}
    spec: dict[str, Any] = {"name": args.name, "schedule": schedule, "message": args.message,
                            "session_target": args.session, "agent": args.agent,
                            "delivery": args.deliver, "timeout": args.timeout}
    if args.keep:
        spec["delete_after_run"] = False
    return {k: v for k, v in spec.items() if v is not None}


def _cron_add(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    spec = _spec(args)
    client = running_client(loaded)
    if client is not None:
        job = call_api(client, "POST", "/api/cron", spec)
    else:
        from gateway.scheduling.cron_jobs import job_from_spec
        from scheduler.cron.job import job_to_dict
        from scheduler.cron.store import CronStoreError
        now = SYSTEM_CLOCK.time()
        try:
            new = job_from_spec(spec, now=now, config=loaded.config)
        except ValueError as exc:
            raise CliError(f"error: {exc}", 2) from None
        new.next_run_at = _first_run(new, now, _tz_default(loaded))
        try:
            with _store(loaded).transaction() as jobs:
                jobs.append(new)
        except CronStoreError as exc:
            raise CliError(f"error: {exc}") from None
        job = job_to_dict(new)
    return _print_job("added", job, args, loaded, online=client is not None)


def _patch(args: argparse.Namespace) -> dict[str, Any]:
    """The edit's request form (``PATCH /api/cron/{id}``) from the flags given."""
    patch: dict[str, Any] = {}
    if args.cron:
        patch["schedule"] = {"kind": "cron", "expr": args.cron, "tz": args.tz}
    elif args.every:
        patch["schedule"] = {"kind": "every", "interval": args.every}
    elif args.at:
        patch["schedule"] = {"kind": "at", "at": args.at}
    elif args.tz:
        patch["tz"] = args.tz
    for key, value in (("name", args.name), ("message", args.message),
                       ("session_target", args.session), ("delivery", args.deliver),
                       ("timeout", args.timeout)):
        if value is not None:
            patch[key] = value
    if not patch:
        raise CliError("error: nothing to change (give --schedule, --every, --at, --tz, "
                       "--message, --session, --deliver, --name or --timeout)", 2)
    return patch


def _cron_edit(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    patch = _patch(args)
    client = running_client(loaded)
    if client is not None:
        job = call_api(client, "PATCH", f"/api/cron/{args.id}", patch)
    else:
        from gateway.scheduling.cron_jobs import edit_fields
        from scheduler.cron.job import validate_job
        now = SYSTEM_CLOCK.time()

        def change(j: Any, _jobs: list[Any]) -> None:
            try:
                fields = edit_fields(j, patch, now=now, config=loaded.config)
            except ValueError as exc:
                raise CliError(f"error: {exc}", 2) from None
            for key, value in fields.items():
                setattr(j, key, value)
            if "schedule" in fields and j.schedule.get("kind") == "every":
                j.schedule["anchor"] = now + float(j.schedule["interval"])
            validate_job(j)
            if "schedule" in fields and j.enabled:
                j.next_run_at, j.consecutive_errors = _first_run(j, now, _tz_default(loaded)), 0
            j.updated_at = now
        job = _offline_edit(loaded, args.id, change)
    return _print_job("updated", job, args, loaded, online=client is not None)


def _print_job(verb: str, job: dict[str, Any], args: argparse.Namespace,
               loaded: LoadedConfig, *, online: bool) -> int:
    if args.json:
        print_json(job)
    else:
        print(f"{verb} cron job {job['id']} ({job['name']}): {_describe(job)}; next run "
              f"{_next_local(job, _tz_default(loaded))}"
              + ("" if online else " (gateway not running: saved to jobs.json)"))
    return 0


def _cron_list(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    client = running_client(loaded)
    if client is not None:
        jobs = call_api(client, "GET", "/api/cron")
    else:
        from scheduler.cron.job import job_to_dict
        from scheduler.cron.store import CronStoreError
        try:
            jobs = [job_to_dict(j) for j in _store(loaded).load()]
        except CronStoreError as exc:
            raise CliError(f"error: {exc}") from None
    if args.json:
        print_json(jobs)
        return 0
    if not jobs:
        print("no cron jobs")
        return 0
    tz = _tz_default(loaded)
    rows = [("ID", "NAME", "ON", "SCHEDULE", "TARGET", "NEXT RUN (job tz)", "LAST")]
    for j in jobs:
        last = j.get("last_status") or "-"
        if j.get("consecutive_errors"):
            last += f" x{j['consecutive_errors']}"
        rows.append((j["id"], j.get("name") or "", "yes" if j.get("enabled") else "no",
                     _describe(j), f"{j.get('agent')}/{j.get('session_target')}",
                     _next_local(j, tz), last))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + str(r[-1]))
    if client is None:
        print("(gateway not running: read from jobs.json)")
    return 0


def _cron_run(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    client = running_client(loaded)
    if client is None:
        raise CliError("error: `cron run` needs the running gateway to run the job; "
                       "start it with `tidegate gateway`")
    out = call_api(client, "POST", f"/api/cron/{args.id}/run", timeout=RUN_TIMEOUT_S)
    if args.json:
        print_json(out)
    else:
        print(_run_summary(args.id, out))
    return 0 if out.get("status") == "ok" else 1


def _run_summary(job_id: str, out: dict[str, Any]) -> str:
    """``ok (delivered)``, or ``ok (not delivered: why)`` followed by the reply, so the
    operator never reads a bare ``ok`` for a reply that went nowhere."""
    status = out.get("status")
    if out.get("error"):
        status = f"{status}: {out['error']}"
    elif out.get("delivered"):
        status = f"{status} (delivered)"
    elif out.get("not_delivered"):
        status = f"{status} (not delivered: {out['not_delivered']})"
    line = f"ran cron job {job_id}: {status}"
    reply = (out.get("reply") or "").strip()
    if reply and not out.get("delivered"):
        line += "\n" + reply
    return line


def _cron_toggle(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    enable = args.cron_cmd == "enable"
    client = running_client(loaded)
    if client is not None:
        job = call_api(client, "POST", f"/api/cron/{args.id}/{args.cron_cmd}")
    else:
        now, tz = SYSTEM_CLOCK.time(), _tz_default(loaded)

        def change(j: Any, _jobs: list[Any]) -> None:
            # The same rules as CronService.update: enabling starts from now.
            if enable and not j.enabled:
                j.enabled, j.consecutive_errors = True, 0
                j.next_run_at = _first_run(j, now, tz)
            elif not enable:
                j.enabled, j.next_run_at = False, None
            j.updated_at = now
        job = _offline_edit(loaded, args.id, change)
    if args.json:
        print_json(job)
    else:
        state = "enabled" if job.get("enabled") else "disabled"
        print(f"cron job {job['id']} ({job.get('name')}) {state}; next run "
              f"{_next_local(job, _tz_default(loaded))}")
    return 0


def _cron_rm(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    client = running_client(loaded)
    if client is not None:
        call_api(client, "DELETE", f"/api/cron/{args.id}")
    else:
        _offline_edit(loaded, args.id, lambda j, jobs: jobs.remove(j))
    if args.json:
        print_json({"ok": True, "removed": args.id})
    else:
        print(f"removed cron job {args.id} (its run log is kept)")
    return 0


def _cron_runs(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    if args.limit < 1:
        raise CliError("error: --limit must be at least 1", 2)
    client = running_client(loaded)
    if client is not None:
        runs = call_api(client, "GET", f"/api/cron/{args.id}/runs?limit={args.limit}")
    else:
        store = _store(loaded)
        try:
            known = {j.id for j in store.load()}
            runs = store.read_runs(args.id, args.limit)
        except ValueError as exc:  # CronStoreError or a malformed id
            raise CliError(f"error: {exc}", 2) from None
        except OSError as exc:
            raise CliError(f"error: {exc}") from None
        if args.id not in known and not runs:
            raise CliError(f"error: no cron job with id {args.id!r}")
    if args.json:
        print_json(runs)
        return 0
    if not runs:
        print(f"cron job {args.id} has not run yet")
        return 0
    for r in runs:
        ms = r.get("duration_ms")
        took = f"{ms / 1000:.1f}s" if isinstance(ms, (int, float)) else "-"
        flags = (" delivered" if r.get("delivered") else "") + \
            (" manual" if r.get("manual") else "")
        err = f"  {r['error']}" if r.get("error") else ""
        sid = f"  session {r['session_id']}" if r.get("session_id") else ""
        print(f"{r.get('started_at')}  {r.get('status')!s:<8} {took:>7}{flags}{sid}{err}")
    return 0


_CRON: dict[str, Callable[[argparse.Namespace, LoadedConfig], int]] = {
    "add": _cron_add, "edit": _cron_edit, "list": _cron_list, "run": _cron_run, "enable": _cron_toggle,
    "disable": _cron_toggle, "rm": _cron_rm, "runs": _cron_runs,
}


# -- formatting --------------------------------------------------------------------------

def _describe(job: dict[str, Any]) -> str:
    s = job.get("schedule") or {}
    if s.get("kind") == "cron":
        return f"cron '{s.get('expr')}'" + (f" {s['tz']}" if s.get("tz") else "")
    if s.get("kind") == "every":
        return f"every {format_duration(float(s.get('interval') or 0))}"
    return f"at {s.get('at')}"


def _next_local(job: dict[str, Any], tz_default: str) -> str:
    """The job's next run in its own zone (``schedule.tz``, else the user's timezone)."""
    from scheduler.cron.crontab import resolve_tz
    nxt = job.get("next_run_at")
    if not nxt:
        return "-" if job.get("enabled") else "- (disabled)"
    s = job.get("schedule") or {}
    tz = (s.get("tz") if s.get("kind") == "cron" else None) or tz_default
    local = datetime.fromtimestamp(parse_iso(nxt), resolve_tz(tz))
    return local.strftime("%Y-%m-%d %H:%M %Z") + ("" if tz == "UTC" else f" ({tz})")
