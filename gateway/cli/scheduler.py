"""``tidegate system event`` and ``tidegate heartbeat`` (issue 4; DESIGN.md "Scheduler"),
and the control-API helpers the scheduler commands share (``tidegate cron``:
gateway/cli/cron/). Both need the gateway: the system-event queue lives in its memory
and the heartbeat runs inside it.

Exit codes: 0 ok, 1 failure (gateway down, API error), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.cli.output import print_json
from gateway.config.load import LoadedConfig


class CliError(Exception):
    """A failure to report on stderr; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def register(sub: Any) -> None:
    """Add ``system`` and ``heartbeat`` to the CLI's subparsers (gateway/cli/main.py)."""
    s = sub.add_parser("system", help="system events for the agent (needs the gateway)")
    ssub = s.add_subparsers(dest="system_cmd", required=True, metavar="ACTION")
    ev = ssub.add_parser("event", help="queue a system event for a session",
                         epilog="Exit 1 for a session that does not exist (`no session "
                                "KEY`: nothing would ever read the event).")
    ev.add_argument("--text", required=True, help="the event text the agent will read")
    ev.add_argument("--session", metavar="KEY", help="session key (default: the default "
                    "agent's main session)")
    ev.add_argument("--wake", choices=["now", "next-heartbeat"], default="next-heartbeat",
                    help="now: run a turn soon; next-heartbeat: ride along (default)")
    ev.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_system)

    h = sub.add_parser("heartbeat", help="heartbeat (needs the gateway)")
    hsub = h.add_subparsers(dest="heartbeat_cmd", required=True, metavar="ACTION")
    now = hsub.add_parser("now", help="run a heartbeat beat now")
    now.add_argument("--agent", help="agent id (default: the first agent)")
    h.set_defaults(func=cmd_heartbeat)


# -- the control API -------------------------------------------------------------------

def control_client(loaded: LoadedConfig) -> Any:
    from gateway.cli.client import ControlClient
    return ControlClient.from_config(loaded)


def running_client(loaded: LoadedConfig) -> Any:
    """The control client when the gateway answers, else None."""
    client = control_client(loaded)
    return client if client.is_up() else None


def call_api(client: Any, method: str, path: str, body: Any = None, timeout: float = 60.0,
         needs: str | None = None) -> Any:
    """``client.request`` with failures as :class:`CliError` (400 -> exit 2); ``needs``
    says why a command cannot do without the gateway."""
    from gateway.cli.client import ApiError, GatewayUnavailable
    try:
        return client.request(method, path, body, timeout=timeout)
    except ApiError as exc:
        raise CliError(f"error: {exc}", 2 if exc.status == 400 else 1) from None
    except GatewayUnavailable as exc:
        raise CliError(f"error: {exc}" + (f" ({needs})" if needs else "")) from None


# -- system events and heartbeat ---------------------------------------------------------

def cmd_system(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    body = {"text": args.text, "wake": args.wake}
    if args.session:
        body["session_key"] = args.session
    try:
        out = call_api(control_client(loaded), "POST", "/api/system-event", body, timeout=30,
                   needs="system events live in the gateway's memory")
    except CliError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code
    if args.json:
        print_json(out)
    else:
        what = "queued" if out.get("queued") else "collapsed into the previous identical event"
        print(f"system event {what} for {out.get('session_key')} (wake: {out.get('wake')})")
    return 0


def cmd_heartbeat(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    agent = (args.agent or loaded.config.default_agent()).lower()
    try:
        call_api(control_client(loaded), "POST", f"/api/heartbeat/{agent}", timeout=30,
             needs="the heartbeat runs inside the gateway")
    except CliError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code
    print(f"heartbeat requested for agent {agent}")
    return 0
