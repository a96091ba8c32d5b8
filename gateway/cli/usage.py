"""``tidegate usage`` (reads the usage ledger directly, gateway running or not) and
``tidegate budget status|raise|reset`` (through the running gateway, which holds the
budget state; on the state file directly when it is down)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from gateway.cli.output import print_json
from gateway.config.load import LoadedConfig


def register(sub: Any) -> None:
    from gateway.logs.records import parse_when
    from runtime.usage.report import GROUPS
    u = sub.add_parser("usage", help="model usage and cost from the usage ledger")
    now = time.time()
    u.add_argument("--since", type=lambda t: parse_when(t, now), metavar="WHEN",
                   default=None, help="from WHEN: 7d, 24h (ago), an RFC 3339 time or a local "
                                      "date (default: everything)")
    u.add_argument("--by", choices=GROUPS, default="model", help="group rows by this "
                   "(days in the budget timezone; default model)")
    for flag, what in (("--agent", "agent id"), ("--session", "session key"),
                       ("--model", "provider/model"), ("--channel", "channel name")):
        u.add_argument(flag, help=f"only calls of this {what}")
    u.add_argument("--json", action="store_true", help="machine-readable JSON")
    u.set_defaults(func=cmd_usage)

    b = sub.add_parser("budget", help="spending budgets: status, raise, reset")
    bsub = b.add_subparsers(dest="budget_cmd", required=True)
    st = bsub.add_parser("status", help="every cap in force and what is used of it")
    st.add_argument("--json", action="store_true", help="machine-readable JSON")
    r = bsub.add_parser("raise", help="a higher cap until the current period ends")
    r.add_argument("--daily-usd", type=float, help="today's cap in USD")
    r.add_argument("--monthly-usd", type=float, help="this month's cap in USD")
    r.add_argument("--agent", help="the agent's own cap instead of the global one")
    rs = bsub.add_parser("reset", help="spend so far in the period stops counting")
    rs.add_argument("--monthly", action="store_true", help="this month (default: today)")
    rs.add_argument("--agent", help="the agent's own cap instead of the global one")
    b.set_defaults(func=cmd_budget)


def _tz(loaded: LoadedConfig) -> str:
    cfg = loaded.config
    return cfg.budgets.timezone or cfg.agent(cfg.default_agent()).user_timezone


def cmd_usage(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.service.storage import offline_records
    from runtime.usage.ledger import UsageLedger
    from runtime.usage.report import render, summarize
    ledger = offline_records(loaded, "usage") or UsageLedger(loaded.state_dir / "usage")
    model_filter = args.model
    wanted = {"agent": args.agent, "session_key": args.session, "channel": args.channel}
    wanted = {k: v.lower() for k, v in wanted.items() if v}

    def keep(rec: dict[str, Any]) -> bool:
        if model_filter and f"{rec.get('provider')}/{rec.get('model')}" != model_filter:
            return False
        return all(str(rec.get(k, "")).lower() == v for k, v in wanted.items())

    rep = summarize((r for r in ledger.records(since=args.since) if keep(r)), by=args.by,
                    tz=_tz(loaded))
    if args.json:
        print_json({**rep, "timezone": _tz(loaded)})
    elif not rep["total"]["calls"]:
        print("no model calls recorded" + (" in that range" if args.since else ""))
    else:
        print(render(rep, title=f"usage by {args.by} (days in {_tz(loaded)})"))
    return 0


def cmd_budget(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.client import ApiError, ControlClient
    client = ControlClient.from_config(loaded)
    try:
        if client.is_up():
            out = _online(client, args)
        else:
            out = _offline(loaded, args)
    except (ApiError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) or exc.status == 400 else 1
    if getattr(args, "json", False):
        print_json(out)
        return 0
    if not out["budgets"]:
        print("no budgets configured (budgets: in config.yaml)")
    for b in out["budgets"]:
        who = f" agent {b['agent']}" if b["agent"] else ""
        print(f"{b['scope']}{who}: ${b['used']:.2f} of ${b['usd']:.2f} ({b['share']:.0%}); "
              f"resets at {b['resets_at']}")
    return 0


def _change(args: argparse.Namespace) -> tuple[str, dict[str, Any]] | None:
    if args.budget_cmd == "status":
        return None
    if args.budget_cmd == "reset":
        return "reset", {"scope": "monthly" if args.monthly else "daily", "agent": args.agent}
    if (args.daily_usd is None) == (args.monthly_usd is None):
        raise ValueError("give one of --daily-usd or --monthly-usd")
    scope = "daily" if args.daily_usd is not None else "monthly"
    return "raise", {"scope": scope, "usd": args.daily_usd or args.monthly_usd,
                     "agent": args.agent}


def _online(client: Any, args: argparse.Namespace) -> dict[str, Any]:
    change = _change(args)
    if change is None:
        return client.request("GET", "/api/budget", timeout=10)
    return client.request("POST", f"/api/budget/{change[0]}", change[1], timeout=10)


def _offline(loaded: LoadedConfig, args: argparse.Namespace) -> dict[str, Any]:
    from runtime.clock import SYSTEM_CLOCK
    from runtime.usage.budget import Budgets
    from runtime.usage.ledger import UsageLedger
    budgets = Budgets(loaded.config.budgets, tz=_tz(loaded), clock=SYSTEM_CLOCK,
                      state_path=loaded.state_dir / "usage" / "budget_state.json")
    from gateway.service.storage import offline_records
    ledger = offline_records(loaded, "usage") or UsageLedger(loaded.state_dir / "usage")
    budgets.load(ledger.records(
        since=SYSTEM_CLOCK.time() - 32 * 86400))
    change = _change(args)
    if change is not None:
        action, body = change
        if action == "raise":
            budgets.raise_cap(body["scope"], float(body["usd"]), body["agent"])
        else:
            budgets.reset(body["scope"], body["agent"])
    return {"budgets": budgets.status(loaded.config.agent_ids())}
