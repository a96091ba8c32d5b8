"""The ``tidegate`` command line.

Every command reads the config from ``--config PATH`` or ``$TIDEGATE_CONFIG`` (then
``~/.tidegate/config.yaml``, then built-in defaults). Commands that act on a running gateway
talk to its loopback control API; exit codes: 0 ok, 1 failure, 2 bad config or usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from gateway.cli.chat import cmd_agent, cmd_chat
from gateway.cli.log_reader import nonneg_int
from gateway.cli.output import print_json
from gateway.config_load import ConfigError, LoadedConfig, load_config

Command = Callable[[argparse.Namespace, LoadedConfig], int]


def _client(loaded: LoadedConfig):
    from gateway.cli.client import ControlClient
    return ControlClient.from_config(loaded)


# -- commands ---------------------------------------------------------------------------

def cmd_config_validate(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.models import config_findings
    where = loaded.path or "built-in defaults"
    errors, warnings = config_findings(loaded.config)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    if errors:
        print(f"invalid config ({where}):", file=sys.stderr)
        for line in errors:
            print(f"  {line}", file=sys.stderr)
        return 2
    print(f"config OK ({where}); state dir {loaded.state_dir}; agents: "
          f"{', '.join(loaded.config.agent_ids())}")
    return 0


def cmd_status(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.client import ApiError, GatewayUnavailable
    try:
        status = _client(loaded).request("GET", "/status", timeout=10)
    except GatewayUnavailable as exc:
        if args.json:
            print_json({"ok": False, "running": False, "error": str(exc)})
        else:
            print(f"gateway: not running ({exc})")
        return 1
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    status["running"] = True
    if args.json:
        print_json(status)
        return 0
    print(f"gateway: running (pid {status['pid']}, up {status['uptime_s']}s, "
          f"ready={status['ready']})")
    chains = (status.get("models") or {}).get("chains") or {}
    for aid, a in status["agents"].items():
        print(f"agent {aid}: model {a['model']}, {a['sessions']} sessions")
        last = (chains.get(aid) or {}).get("last_answer")
        if last:  # which model and auth profile answered (failover)
            print(f"  last answer: {last['model']} (profile {last['profile']}) at {last['at']}")
    lanes = status["lanes"]
    print(f"lanes: {lanes['lanes']} active, running {lanes['running']}, queued "
          f"{lanes['queued']}")
    for name, ch in status["channels"].items():
        print(f"channel {name}: {ch.get('state')}")
    print(f"outbox: {status['outbox']['pending']} pending")
    unconfirmed = status.get("delivery", {}).get("unconfirmed", 0)
    if unconfirmed:
        print(f"delivery: {unconfirmed} unconfirmed (sent, never answered; not resent)")
    for p in status.get("problems", []):
        print(f"problem: {p}")
    return 0


def cmd_sessions(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.sessions import list_sessions, show_session
    if args.sessions_cmd == "show":
        return show_session(loaded, args.key, as_json=args.json)
    if args.sessions_cmd == "abort":
        from gateway.cli.sessions import abort_session
        return abort_session(loaded, args.key, drop_queued=args.all, as_json=args.json)
    return list_sessions(loaded, agent=args.agent, as_json=args.json)


def cmd_logs(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.log_reader import read_logs
    path = loaded.state_dir / "logs" / "gateway.jsonl"
    if not path.exists() and not args.follow:
        print(f"no log file yet at {path}", file=sys.stderr)
        return 1
    try:
        read_logs(path, follow=args.follow, level=args.level, session=args.session,
                  as_json=args.json, lines=args.lines)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_service_install(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.service import install
    return install(loaded, user_mode=args.user, dest_dir=args.dest_dir)


def cmd_dashboard(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    client = _client(loaded)
    print(f"{client.base_url}/#token={client.token}")
    return 0


def cmd_gateway(args: argparse.Namespace, loaded: LoadedConfig | None) -> int:
    from gateway.run import run_gateway
    return run_gateway(args.config)


# -- parser -----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidegate", description="tidegate — an always-on AI "
                                "agent gateway for Slack, Telegram, Discord and webchat.")
    p.add_argument("--config", help="config file (default: $TIDEGATE_CONFIG, then "
                   "~/.tidegate/config.yaml, then built-in defaults)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("gateway", help="run the gateway in the foreground").set_defaults(
        func=cmd_gateway, raw_config=True)

    a = sub.add_parser("agent", help="send one message through the running gateway")
    a.add_argument("-m", "--message", required=True)
    target = a.add_mutually_exclusive_group()
    target.add_argument("--session-key")
    target.add_argument("--to", help="peer id (session agent:<agent>:cli:dm:<peer>)")
    a.add_argument("--agent")
    a.add_argument("--json", action="store_true")
    a.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr")
    a.set_defaults(func=cmd_agent)

    c = sub.add_parser("chat", help="interactive chat through the running gateway")
    target = c.add_mutually_exclusive_group()
    target.add_argument("--session-key")
    target.add_argument("--to")
    c.add_argument("--agent")
    c.set_defaults(func=cmd_chat)

    s = sub.add_parser("sessions", help="list or show sessions")
    ssub = s.add_subparsers(dest="sessions_cmd", required=True)
    sl = ssub.add_parser("list")
    sl.add_argument("--json", action="store_true")
    sl.add_argument("--agent")
    ss = ssub.add_parser("show")
    ss.add_argument("key")
    ss.add_argument("--json", action="store_true")
    sa = ssub.add_parser("abort", help="stop the session's running turn (like /stop)")
    sa.add_argument("key")
    sa.add_argument("--all", action="store_true", help="also drop its queued messages")
    sa.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_sessions)

    st = sub.add_parser("status", help="gateway status")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)

    cfg = sub.add_parser("config", help="config tools")
    csub = cfg.add_subparsers(dest="config_cmd", required=True)
    csub.add_parser("validate", help="validate the config and exit").set_defaults(
        func=cmd_config_validate)

    lg = sub.add_parser("logs", help="show (and follow) the gateway log")
    lg.add_argument("-f", "--follow", action="store_true")
    lg.add_argument("--level", choices=["debug", "info", "warning", "error"])
    lg.add_argument("--session", help="only lines of this session key (prefix match)")
    lg.add_argument("--json", action="store_true", help="raw JSON lines")
    lg.add_argument("-n", "--lines", type=nonneg_int, default=200)
    lg.set_defaults(func=cmd_logs)

    sv = sub.add_parser("service", help="systemd service")
    svsub = sv.add_subparsers(dest="service_cmd", required=True)
    si = svsub.add_parser("install", help="write the systemd unit and print how to start it")
    si.add_argument("--user", action="store_true", help="user service (no root needed)")
    si.add_argument("--dest-dir", help=argparse.SUPPRESS)
    si.set_defaults(func=cmd_service_install)

    sub.add_parser("dashboard", help="print the webchat URL with the token").set_defaults(
        func=cmd_dashboard)

    for register in _extensions():
        register(sub)
    _config_flag_everywhere(p)
    return p


def _config_flag_everywhere(parser: argparse.ArgumentParser) -> None:
    """Accept ``--config`` after any subcommand too (``tidegate gateway --config X``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                if "--config" not in child._option_string_actions:
                    child.add_argument("--config", default=argparse.SUPPRESS,
                                       help=argparse.SUPPRESS)
                _config_flag_everywhere(child)


def _extensions() -> list[Callable[[Any], None]]:
    """Subcommand groups that live in their own modules."""
    import importlib
    out = []
    for module in ("gateway.cli.pairing", "gateway.cli.scheduler", "gateway.cli.timeline",
                   "gateway.cli.mcp", "gateway.cli.models"):
        try:
            out.append(importlib.import_module(module).register)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "raw_config", False):
        return args.func(args, None)
    try:
        # Only `config validate` insists on every ${VAR}: other commands do not need the
        # secrets, which may live only in the service's environment file.
        loaded = load_config(args.config, strict_env=args.func is cmd_config_validate)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    try:
        return args.func(args, loaded)
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
