"""``tidegate approvals list [--json] | allow ID [--always] | deny ID`` (docs/exec.md).

``list`` asks the running gateway (control API ``GET /api/approvals``) and, when it is
not running, reads ``<state_dir>/approvals.json`` (replaced atomically: safe to read), or
PostgreSQL's tables with ``storage.backend: postgres`` (replicas share them).
``allow`` and ``deny`` need the running gateway (the turn that waits is there). Exit
codes: 0 ok, 1 unknown or already decided request, or no gateway for allow/deny.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.cli.output import print_json, quiet_logs
from gateway.config.load import LoadedConfig
from runtime.clock import SYSTEM_CLOCK, format_elapsed, utc_iso


def register(sub: Any) -> None:
    p = sub.add_parser("approvals", help="exec approvals: list, allow, deny")
    asub = p.add_subparsers(dest="approvals_cmd", required=True, metavar="ACTION")
    ls = asub.add_parser("list", help="pending requests, recent decisions, stored patterns")
    ls.add_argument("--json", action="store_true")
    al = asub.add_parser("allow", help="allow a pending request")
    al.add_argument("id", metavar="ID", help="the request id (`tidegate approvals list`)")
    al.add_argument("--always", action="store_true",
                    help="also store the exact command as always allowed")
    dn = asub.add_parser("deny", help="deny a pending request")
    dn.add_argument("id", metavar="ID", help="the request id (`tidegate approvals list`)")
    p.set_defaults(func=cmd_approvals)


@quiet_logs
def cmd_approvals(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.client import ApiError, ControlClient, GatewayUnavailable
    client = ControlClient.from_config(loaded)
    if args.approvals_cmd == "list":
        try:
            data = client.request("GET", "/api/approvals")
        except GatewayUnavailable:
            data = _offline(loaded)
        except ApiError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        _print(data, args.json)
        return 0
    verb = "deny" if args.approvals_cmd == "deny" else "allow"
    body = {"by": "cli", "always": bool(getattr(args, "always", False))}
    try:
        out = client.request("POST", f"/api/approvals/{args.id}/{verb}", body)
    except (GatewayUnavailable, ApiError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    req = out["approval"]
    print(f"approval {req['id']}: {req['status']}{' (always)' if req['always'] else ''} "
          f"- {_shown(req['command'])}")
    return 0


def _offline(loaded: LoadedConfig) -> dict[str, Any]:
    if loaded.config.storage.backend == "postgres":
        import asyncio
        return asyncio.run(_offline_pg(loaded.config.storage.dsn))
    from runtime.approvals.store import ApprovalStore
    store = ApprovalStore(loaded.state_dir)
    decided = [r for r in store.requests.values() if r.status != "pending"]
    return {"pending": [r.to_dict() for r in store.pending()],
            "recent": [r.to_dict() for r in decided], "always": store.always}


async def _offline_pg(dsn: str) -> dict[str, Any]:
    from gateway.cluster.approvals import PgApprovals
    from gateway.cluster.db import ClusterDB
    db = ClusterDB(dsn, min_size=1, max_size=1)
    try:
        return await PgApprovals(db, "", 0.0).listing()
    finally:
        await db.close()


def _print(data: dict[str, Any], as_json: bool) -> None:
    """Every text that comes from a request (its command, why, session key, decider) or
    a stored pattern goes through ``visible`` (gateway/approvals/prompts.py), as the
    chat prompts show them: a bidi override or a blank-looking filler cannot disguise
    what is listed."""
    from gateway.approvals.prompts import visible as v
    if as_json:
        print_json(data)
        return
    now = SYSTEM_CLOCK.time()
    if not data["pending"]:
        print("no pending approvals")
    for r in data["pending"]:
        print(f"{v(r['id'])}  pending  {v(r['agent_id'])}  {v(r['session_key'])}  "
              f"expires in {format_elapsed(r['expires_at'] - now)}\n    {_shown(r['command'])}\n"
              f"    why: {v(r['reason'])}"
              + {"host": "\n    where: runs on the host (no sandbox)",
                 "sandbox": "\n    where: runs in the sandbox"}.get(r.get("runs") or "", ""))
    for r in data["recent"][:10]:
        print(f"{v(r['id'])}  {r['status']}{' (always)' if r['always'] else ''}  by "
              f"{v(r['decided_by'] or '-')}  at "
              f"{utc_iso(r['decided_at'] or r['requested_at'])}\n    {_shown(r['command'])}")
    for agent, patterns in data["always"].items():
        for p in patterns:
            print(f"always allowed for {v(agent)}: {_shown(p['pattern'])} "
                  f"(by {v(str(p['by']))})")


def _shown(command: str) -> str:
    """``command`` whole, with control and bidi characters escaped (as in the chat
    prompts), and a note when there were any."""
    from gateway.approvals.prompts import hidden, visible
    text = visible(command)
    return text if not hidden(command) else f"{text}\n    (control or invisible " \
        "characters shown escaped)"
