"""The built-in command groups that have no module of their own: ``gateway``, ``agent``
and ``chat``, ``sessions``, ``status`` and ``config``, ``logs``, ``service``, ``dashboard``.
Each group is an ``_add_*`` function adding its subparsers (``func`` set to its handler)
and the ``cmd_*`` handlers (``(args, loaded) -> exit code``) they dispatch to."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from gateway.cli.chat import cmd_agent, cmd_chat
from gateway.cli.fast_start import lean_imports, nonneg_int, when_parser
from gateway.cli.status import cmd_status
from gateway.config.load import ConfigError, LoadedConfig, load_gateway_section


def _client(loaded: LoadedConfig):
    from gateway.cli.client import ControlClient
    return ControlClient.from_config(loaded)


# -- commands ---------------------------------------------------------------------------

def cmd_config_validate(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.models import config_findings
    where = loaded.path or "built-in defaults"
    errors, warnings = config_findings(loaded.config, dict(loaded.env))
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    if errors:
        print(f"invalid config ({where}):", file=sys.stderr)
        for line in errors:
            print(f"  {line}", file=sys.stderr)
        return 2
    env = f"; env file {loaded.env_file.path}" if loaded.env_file.path else ""
    print(f"config OK ({where}{env}); state dir {loaded.state_dir}; agents: "
          f"{', '.join(loaded.config.agent_ids())}")
    return 0


def cmd_config_diff_lkg(args: argparse.Namespace, loaded: None) -> int:
    from gateway.cli.config_lkg import diff_lkg
    return diff_lkg(args)


def cmd_sessions(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.sessions import export_sessions, list_sessions, reset_session, show_session
    if args.sessions_cmd == "show":
        return show_session(loaded, args.key, as_json=args.json)
    if args.sessions_cmd == "abort":
        from gateway.cli.sessions import abort_session
        return abort_session(loaded, args.key, drop_queued=args.all, as_json=args.json)
    if args.sessions_cmd in ("fork", "rewind"):
        from gateway.cli.session_fork import fork_or_rewind
        return fork_or_rewind(loaded, args)
    if args.sessions_cmd == "reset":
        return reset_session(loaded, args.key, as_json=args.json)
    if args.sessions_cmd == "outcomes":
        from gateway.cli.outcomes import cmd_sessions_outcomes
        return cmd_sessions_outcomes(args, loaded)
    if args.sessions_cmd == "export" and args.key:
        from gateway.cli.sessions import export_transcript
        return export_transcript(loaded, args.key, output=args.output)
    if args.sessions_cmd == "export":
        return export_sessions(loaded, agent=args.agent.lower(), fmt=args.format,
                               output=args.output)
    return list_sessions(loaded, agent=args.agent, as_json=args.json)


def cmd_logs(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.logs.reader import read_logs
    path = loaded.state_dir / "logs" / "gateway.jsonl"
    if not path.exists() and not args.follow:
        print(f"no log file yet at {path}", file=sys.stderr)
        return 1
    try:
        read_logs(path, follow=args.follow, level=args.level, session=args.session,
                  as_json=args.json, lines=args.lines, utc=args.utc, since=args.since,
                  until=args.until, event=args.event, channel=args.channel)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_service_install(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.service import install
    return install(loaded, user_mode=args.user, dest_dir=args.dest_dir,
                   user_name=args.user_name, group_name=args.group_name,
                   allow_root=args.allow_root)


def cmd_service_uninstall(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.service import uninstall
    return uninstall(user_mode=args.user, dest_dir=args.dest_dir)


def cmd_dashboard(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    client = _client(loaded)
    print(f"{client.base_url}/#token={client.token}")
    return 0


def cmd_gateway(args: argparse.Namespace, loaded: LoadedConfig | None) -> int:
    if args.gateway_cmd is None:
        from gateway.service import cold_start
        cold_start.begin()
        with lean_imports():
            from gateway.service.run import run_gateway
        return run_gateway(args.config, port=args.port, bind=args.bind,
                           env_file=args.env_choice)
    import gateway.cli.gateway_ctl as gateway_ctl  # noqa: PLR0402 - no cycle via gateway.cli
    try:  # status/stop/restart need only the gateway section to find the running gateway:
        # they work while another section is broken (restart then refuses, after checking)
        loaded = gateway_section(args, quick=False)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    if args.gateway_cmd == "status":
        return gateway_ctl.status(loaded, args.json)
    if args.gateway_cmd == "stop":
        return gateway_ctl.stop(loaded)
    if args.gateway_cmd == "reload":
        return gateway_ctl.reload(loaded)
    return gateway_ctl.restart(loaded, args.config, args.env_choice)


def gateway_section(args: argparse.Namespace, quick: bool = True) -> LoadedConfig:
    """The ``gateway`` section, of the last-known-good copy when the file's own cannot be
    read (a gateway with ``on_invalid: lkg`` runs on it then; a note says so on stderr).
    Raises ConfigError (the file's)."""
    try:
        return load_gateway_section(args.config, quick=quick, env_file=args.env_choice)
    except ConfigError as exc:
        from gateway.config.lkg import gateway_section_or_lkg, lkg_note
        loaded = gateway_section_or_lkg(args.config, exc, quick=quick,
                                        env_file=args.env_choice)
        print(lkg_note(loaded), file=sys.stderr)
        return loaded



# -- parsers ----------------------------------------------------------------------------

def _add_gateway(sub: Any) -> None:
    """``gateway [status|stop|reload|restart]``."""
    gw = sub.add_parser("gateway", help="run the gateway in the foreground")
    gw.add_argument("--port", type=int, help="listen on this port (overrides gateway.port; "
                    "0 = any free port)")
    gw.add_argument("--bind", help="listen on this loopback address (overrides gateway.bind)")
    gwsub = gw.add_subparsers(dest="gateway_cmd", required=False)
    gws = gwsub.add_parser("status", help="status of the running gateway")
    gws.add_argument("--json", action="store_true", help="machine-readable JSON")
    gwsub.add_parser("stop", help="stop the running gateway (SIGTERM; waits for the drain)")
    gwsub.add_parser("reload", help="reload config.yaml and the env file (SIGHUP) and say "
                     "how it went (exit 2: refused, the old config stays)")
    gwsub.add_parser("restart", help="restart it (through systemd when it runs under the "
                     "unit, else in the background)",
                     epilog="Exit 2 without stopping the running gateway when the config "
                            "file is invalid.")
    gw.set_defaults(func=cmd_gateway, raw_config=True)


def _add_chat_clients(sub: Any) -> None:
    """``agent -m`` and ``chat``: clients of the running gateway (fast start)."""
    a = sub.add_parser("agent", help="send one message through the running gateway")
    a.add_argument("-m", "--message", required=True, help="the message to send")
    target = a.add_mutually_exclusive_group()
    target.add_argument("--session-key", metavar="KEY",
                        help="run in this session (default: agent:<agent>:cli:dm:local)")
    target.add_argument("--to", help="peer id (session agent:<agent>:cli:dm:<peer>)")
    a.add_argument("--agent", help="agent id (default: the first configured agent)")
    a.add_argument("--json", action="store_true",
                   help="print session_key, session_id, reply, run_id and status as JSON")
    a.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr")
    a.set_defaults(func=cmd_agent, gateway_only=True)

    c = sub.add_parser("chat", help="interactive chat through the running gateway")
    target = c.add_mutually_exclusive_group()
    target.add_argument("--session-key", metavar="KEY", help="chat in this session")
    target.add_argument("--to", help="peer id (session agent:<agent>:cli:dm:<peer>)")
    c.add_argument("--agent", help="agent id (default: the first configured agent)")
    c.set_defaults(func=cmd_chat, gateway_only=True)


def _add_sessions(sub: Any) -> None:
    """``sessions list|show|abort|reset|export|outcomes|fork|rewind``."""
    s = sub.add_parser("sessions", help="list, show, abort, reset, export, fork or rewind "
                       "sessions, and list their outcomes")
    ssub = s.add_subparsers(dest="sessions_cmd", required=True)
    sl = ssub.add_parser("list", help="sessions, most recently active first")
    sl.add_argument("--json", action="store_true", help="machine-readable JSON")
    sl.add_argument("--agent", help="only this agent's sessions")
    ss = ssub.add_parser("show", help="one session: ids, times, counters, last route")
    ss.add_argument("key", metavar="KEY", help="the session key")
    ss.add_argument("--json", action="store_true", help="machine-readable JSON")
    sa = ssub.add_parser("abort", help="stop the session's running turn (like /stop)")
    sa.add_argument("key", metavar="KEY", help="the session key")
    sa.add_argument("--all", action="store_true", help="also drop its queued messages")
    sa.add_argument("--json", action="store_true", help="machine-readable JSON")
    sr = ssub.add_parser("reset", help="start a fresh session under KEY (as /reset in that "
                         "chat; needs the running gateway)")
    sr.add_argument("key", metavar="KEY", help="the session key")
    sr.add_argument("--json", action="store_true", help="machine-readable JSON")
    se = ssub.add_parser("export", help="write a session's transcript (KEY: OpenClaw-v3 "
                         "JSONL) or the session store in another product's format")
    se.add_argument("key", metavar="KEY", nargs="?",
                    help="session key or id: write its transcript as JSONL")
    se.add_argument("--format", default="openclaw", help="openclaw (OpenClaw's sessions.json)")
    se.add_argument("--agent", default="main", help="agent id (default: main)")
    se.add_argument("--output", "-o", help="file to write (default: stdout)")
    from gateway.cli.outcomes import add_sessions_outcomes
    add_sessions_outcomes(ssub)
    from gateway.cli.session_fork import add_fork_parsers
    add_fork_parsers(ssub)
    s.set_defaults(func=cmd_sessions)


def _add_status_and_config(sub: Any) -> None:
    """``status`` and ``config validate``."""
    st = sub.add_parser("status", help="gateway status")
    st.add_argument("--json", action="store_true", help="machine-readable JSON")
    st.set_defaults(func=cmd_status, gateway_only=True)  # answers while a section is broken

    cfg = sub.add_parser("config", help="config tools")
    csub = cfg.add_subparsers(dest="config_cmd", required=True)
    cv = csub.add_parser("validate", help="validate the config (every ${VAR} set, in the "
                         "environment or the env file) and exit",
                         epilog="Exit 2 when the config is invalid (every problem is listed "
                                "with its key); warnings alone exit 0.")
    cv.set_defaults(func=cmd_config_validate)
    csub.add_parser("diff-lkg", help="show what changed since the last-known-good config "
                    "(config.lkg.yaml)").set_defaults(func=cmd_config_diff_lkg, raw_config=True)


def _add_logs(sub: Any) -> None:
    """``logs``: show (and follow) the gateway log."""
    lg = sub.add_parser("logs", help="show (and follow) the gateway log")
    lg.add_argument("-f", "--follow", action="store_true",
                    help="keep printing new lines as they are written")
    lg.add_argument("--level", choices=["debug", "info", "warning", "error"],
                    help="only lines at this level or above")
    lg.add_argument("--session", help="only lines of this session key (prefix match)")
    lg.add_argument("--event", help="only events of this name (prefix match: turn_)")
    lg.add_argument("--channel", help="only lines of this channel (prefix match: telegram)")
    lg.add_argument("--json", action="store_true", help="raw JSON lines")
    lg.add_argument("-n", "--lines", type=nonneg_int, default=200,
                    help="how many of the last matching lines to show (default 200)")
    now = time.time()
    when = when_parser(now)
    lg.add_argument("--since", type=when, metavar="WHEN",
                    help="only lines at or after WHEN: 10m, 2h, 7d ago, an RFC 3339 time "
                         "or a local date YYYY-MM-DD[ HH:MM]")
    lg.add_argument("--until", type=when, metavar="WHEN",
                    help="only lines before WHEN (same forms as --since)")
    lg.add_argument("--utc", action="store_true",
                    help="show times in UTC (default: local time with its zone)")
    lg.set_defaults(func=cmd_logs)


def _add_service(sub: Any) -> None:
    """``service install|uninstall``: the systemd unit."""
    sv = sub.add_parser("service", help="systemd service")
    svsub = sv.add_subparsers(dest="service_cmd", required=True)
    si = svsub.add_parser("install", help="write the systemd unit and print how to start it")
    si.add_argument("--user", action="store_true", help="user service (no root needed)")
    si.add_argument("--user-name", metavar="NAME",
                    help="system unit: the account the gateway runs as (default: tidegate)")
    si.add_argument("--group-name", metavar="NAME",
                    help="system unit: its group (default: the same as --user-name)")
    si.add_argument("--allow-root", action="store_true",
                    help="system unit: allow --user-name root (refused otherwise)")
    si.add_argument("--dest-dir", help=argparse.SUPPRESS)
    si.set_defaults(func=cmd_service_install)
    su = svsub.add_parser("uninstall", help="stop, disable and remove the systemd unit "
                          "(state, config and secrets are kept)")
    su.add_argument("--user", action="store_true", help="the user service")
    su.add_argument("--dest-dir", help=argparse.SUPPRESS)
    su.set_defaults(func=cmd_service_uninstall)


def _add_dashboard(sub: Any) -> None:
    sub.add_parser("dashboard", help="print the webchat URL with the token").set_defaults(
        func=cmd_dashboard)


BUILT_IN_GROUPS = (_add_gateway, _add_chat_clients, _add_sessions, _add_status_and_config,
                    _add_logs, _add_service, _add_dashboard)
FAST_GROUPS = {"gateway": (_add_gateway,), "agent": (_add_chat_clients,),
                "chat": (_add_chat_clients,)}


