"""``cron add|edit|enable|disable|rm``: through the running gateway's control API, else on
the store directly (gateway/cli/cron/store.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.cli.cron.format import delivers, describe, next_local
from gateway.cli.cron.store import default_tz, first_run, job_store, offline_edit
from gateway.cli.output import print_json
from gateway.cli.scheduler import CliError, call_api, running_client
from gateway.config.load import LoadedConfig
from runtime.clock import SYSTEM_CLOCK


def _tz_rule(args: argparse.Namespace) -> None:
    """``--tz`` goes with ``--cron`` only, for ``cron add`` and ``cron edit`` alike (an
    ``--at``/``--every`` schedule has no timezone; ``cron edit --tz`` alone re-zones a
    cron schedule). Raises CliError (exit 2)."""
    if args.tz and (args.every or args.at or (not args.cron and args.cron_cmd == "add")):
        raise CliError("error: --tz only applies to --cron", 2)


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    _tz_rule(args)
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


def cron_add(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    spec = _spec(args)
    client = running_client(loaded)
    if client is not None:
        job = call_api(client, "POST", "/api/cron", spec)
    else:
        from gateway.scheduling.cron_jobs import job_from_spec, job_json
        from scheduler.cron.store import CronStoreError
        now = SYSTEM_CLOCK.time()
        try:
            new = job_from_spec(spec, now=now, config=loaded.config)
        except ValueError as exc:
            raise CliError(f"error: {exc}", 2) from None
        new.next_run_at = first_run(new, now, default_tz(loaded))
        try:
            with job_store(loaded).transaction() as jobs:
                jobs.append(new)
        except CronStoreError as exc:
            raise CliError(f"error: {exc}") from None
        job = job_json(new)
    return _print_job("added", job, args, loaded, online=client is not None)


def _patch(args: argparse.Namespace) -> dict[str, Any]:
    """The edit's request form (``PATCH /api/cron/{id}``) from the flags given."""
    _tz_rule(args)
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


def cron_edit(args: argparse.Namespace, loaded: LoadedConfig) -> int:
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
                j.next_run_at, j.consecutive_errors = first_run(j, now, default_tz(loaded)), 0
            j.updated_at = now
        job = offline_edit(loaded, args.id, change)
    return _print_job("updated", job, args, loaded, online=client is not None)


def _print_job(verb: str, job: dict[str, Any], args: argparse.Namespace,
               loaded: LoadedConfig, *, online: bool) -> int:
    if args.json:
        print_json(job)
    else:
        print(f"{verb} cron job {job['id']} ({job['name']}): {describe(job)}; next run "
              f"{next_local(job, default_tz(loaded))}; {delivers(job)}"
              + ("" if online else " (gateway not running: saved to jobs.json)"))
    if job.get("delivery_warning"):
        print(f"warning: {job['delivery_warning']}", file=sys.stderr)
    return 0


def cron_toggle(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    enable = args.cron_cmd == "enable"
    client = running_client(loaded)
    if client is not None:
        job = call_api(client, "POST", f"/api/cron/{args.id}/{args.cron_cmd}")
    else:
        now, tz = SYSTEM_CLOCK.time(), default_tz(loaded)

        def change(j: Any, _jobs: list[Any]) -> None:
            # The same rules as CronService.update: enabling starts from now.
            if enable and not j.enabled:
                j.enabled, j.consecutive_errors = True, 0
                j.next_run_at = first_run(j, now, tz)
            elif not enable:
                j.enabled, j.next_run_at = False, None
            j.updated_at = now
        job = offline_edit(loaded, args.id, change)
    if args.json:
        print_json(job)
    else:
        state = "enabled" if job.get("enabled") else "disabled"
        print(f"cron job {job['id']} ({job.get('name')}) {state}; next run "
              f"{next_local(job, default_tz(loaded))}")
    return 0


def cron_rm(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    client = running_client(loaded)
    if client is not None:
        call_api(client, "DELETE", f"/api/cron/{args.id}")
    else:
        offline_edit(loaded, args.id, lambda j, jobs: jobs.remove(j))
    if args.json:
        print_json({"ok": True, "removed": args.id})
    else:
        print(f"removed cron job {args.id} (its run log is kept)")
    return 0
