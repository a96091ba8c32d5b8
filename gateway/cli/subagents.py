"""``tidegate subagents list|show RUN|kill RUN [--json]`` (seed 001 §6).

``list`` and ``show`` read ``<state_dir>/subagents/runs.json`` directly (it is replaced
atomically, so reading while the gateway runs is safe) or, on PostgreSQL storage, the
shared ``subagent_runs`` table (every replica's runs, each naming its ``replica``);
``kill`` asks the running gateway (control API ``POST /api/subagents/{run}/kill``). Exit codes: 0 ok, 1 failure (unknown
run, corrupt file, gateway down).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.cli.output import print_json, quiet_logs
from gateway.config.load import LoadedConfig
from runtime.clock import SYSTEM_CLOCK
from runtime.subagents.records import CorruptRunsFile, RunRecord, RunStore


def _records(loaded: LoadedConfig) -> dict[str, RunRecord] | None:
    from gateway.service.storage import offline_records
    from runtime.storage.postgres.errors import StorageUnavailable
    try:
        shared = offline_records(loaded, "subagents")
    except StorageUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    try:
        store = RunStore(loaded.state_dir / "subagents" / "runs.json", records=shared)
        return {r.run_id: r for r in store.every()}
    except CorruptRunsFile as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    finally:
        if shared is not None:
            shared.bridge.close()


@quiet_logs
def list_runs(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.subagents import describe_runs
    records = _records(loaded)
    if records is None:
        return 1
    if args.json:
        print_json([r.to_json() for r in records.values()])
        return 0
    print(describe_runs(list(records.values()), SYSTEM_CLOCK.time())
          .replace("in this session", "yet"))
    return 0


@quiet_logs
def show_run(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    records = _records(loaded)
    if records is None:
        return 1
    rec = records.get(args.run)
    if rec is None:
        print(f"error: no subagent run {args.run!r}", file=sys.stderr)
        return 1
    data = rec.to_json()
    if args.json:
        print_json(data)
        return 0
    for key, value in data.items():
        if value not in (None, {}, ""):
            print(f"{key}: {value}")
    return 0


def kill_run(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.client import ApiError, ControlClient, GatewayUnavailable
    try:
        out = ControlClient.from_config(loaded).request(
            "POST", f"/api/subagents/{args.run}/kill", {})
    except (GatewayUnavailable, ApiError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json(out["run"])
    else:
        print(f"kill requested for {args.run} (status {out['run']['outcome'] or 'running'})")
    return 0


def register(sub: Any) -> None:
    s = sub.add_parser("subagents", help="subagent runs: list, show, kill")
    ssub = s.add_subparsers(dest="subagents_cmd", required=True)
    ls = ssub.add_parser("list", help="every run record")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=list_runs)
    for name, func, help_text in (("show", show_run, "one run record"),
                                  ("kill", kill_run, "stop a running run")):
        p = ssub.add_parser(name, help=help_text, epilog="Exit 1 for an unknown run, and for "
                            "kill when the run has already ended." if name == "kill" else
                            "Exit 1 for an unknown run.")
        p.add_argument("run", help="run id (from subagents list)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)
