"""``cron list|run|runs``: the jobs, running one now (needs the gateway), a job's run log."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.cli.cron.format import describe, next_local
from gateway.cli.cron.store import default_tz, job_store
from gateway.cli.output import print_json
from gateway.cli.scheduler import CliError, call_api, running_client
from gateway.config.load import LoadedConfig

RUN_TIMEOUT_S = 4000.0  # `cron run` waits for the run (isolated turns may take 60 min)


def cron_list(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    client = running_client(loaded)
    if client is not None:
        jobs = call_api(client, "GET", "/api/cron")
    else:
        from gateway.scheduling.cron_jobs import job_json
        from scheduler.cron.store import CronStoreError
        try:
            jobs = [job_json(j) for j in job_store(loaded).load()]
        except CronStoreError as exc:
            raise CliError(f"error: {exc}") from None
    if args.json:
        print_json(jobs)
        return 0
    if not jobs:
        print("no cron jobs")
        return 0
    tz = default_tz(loaded)
    rows = [("ID", "NAME", "ON", "SCHEDULE", "RUNS IN", "DELIVERS TO", "NEXT RUN (job tz)",
             "LAST")]
    for j in jobs:
        last = j.get("last_status") or "-"
        if j.get("consecutive_errors"):
            last += f" x{j['consecutive_errors']}"
        rows.append((j["id"], j.get("name") or "", "yes" if j.get("enabled") else "no",
                     describe(j), f"{j.get('agent')}/{j.get('session_target')}",
                     _target(j), next_local(j, tz), last))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + str(r[-1]))
    if client is None:
        print("(gateway not running: read from jobs.json)")
    for j in jobs:
        if j.get("delivery_warning"):
            print(f"warning: {j['delivery_warning']}", file=sys.stderr)
    return 0


def _target(job: dict[str, Any]) -> str:
    """The DELIVERS TO column: the resolved target, ``heartbeat`` for a main job (its system
    event wakes the heartbeat, which speaks), ``nowhere`` without one."""
    if job.get("session_target") == "main":
        return "heartbeat"
    return job.get("deliver_to") or "nowhere"


def cron_run(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    client = running_client(loaded)
    if client is None:
        raise CliError("error: `cron run` needs the running gateway to run the job; "
                       "start it with `tidegate gateway`")
    out = call_api(client, "POST", f"/api/cron/{args.id}/run", timeout=RUN_TIMEOUT_S)
    if args.json:
        print_json(out)
    else:
        print(run_summary(args.id, out))
    return 0 if out.get("status") == "ok" else 1


def run_summary(job_id: str, out: dict[str, Any]) -> str:
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


def cron_runs(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    if args.limit < 1:
        raise CliError("error: --limit must be at least 1", 2)
    client = running_client(loaded)
    if client is not None:
        runs = call_api(client, "GET", f"/api/cron/{args.id}/runs?limit={args.limit}")
    else:
        store = job_store(loaded)
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
