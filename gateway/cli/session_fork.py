"""``tidegate sessions fork|rewind``: the parsers and the control-API call (the work runs
in the gateway, on the session's lane: gateway/sessions/fork.py)."""

from __future__ import annotations

import sys
from typing import Any
from urllib.parse import quote

from gateway.cli.output import print_json


def add_fork_parsers(ssub: Any) -> None:
    """``sessions fork KEY --at N [--switch]`` and ``sessions rewind KEY --to N``."""
    sf = ssub.add_parser("fork", help="a new session holding the first N turns of KEY "
                         "(needs the running gateway)")
    sf.add_argument("key", metavar="KEY", help="the session key")
    sf.add_argument("--at", required=True, metavar="N|ID",
                    help="turn count, or the id of a transcript entry (its turn included); "
                    "turn:N or id:X to say which")
    sf.add_argument("--switch", action="store_true",
                    help="KEY itself goes on in the fork (default: a new key KEY:fork:<hex>)")
    sf.add_argument("--json", action="store_true", help="machine-readable JSON")
    sw = ssub.add_parser("rewind", help="KEY goes on from turn N; later turns stay in the "
                         "old transcript (needs the running gateway)")
    sw.add_argument("key", metavar="KEY", help="the session key")
    sw.add_argument("--to", required=True, metavar="N|ID",
                    help="turn count or entry id (turn:N or id:X to say which)")
    sw.add_argument("--json", action="store_true", help="machine-readable JSON")


def fork_or_rewind(loaded: Any, args: Any) -> int:
    """Run ``sessions fork|rewind`` through the control API (on the session's lane)."""
    from gateway.cli.client import ApiError, ControlClient, GatewayUnavailable
    cmd = args.sessions_cmd
    at = args.to if cmd == "rewind" else args.at
    if not at.strip():
        print(f"error: {'--to' if cmd == 'rewind' else '--at'} needs a turn count or an "
              "entry id", file=sys.stderr)
        return 2
    body = {"to": at} if cmd == "rewind" else {"at": at, "switch": args.switch}
    try:
        out = ControlClient.from_config(loaded).request(
            "POST", f"/api/sessions/{quote(args.key, safe='')}/{cmd}", body=body, timeout=120)
    except (GatewayUnavailable, ApiError) as exc:
        hint = "" if isinstance(exc, ApiError) else f" (a {cmd} needs the running gateway)"
        print(f"error: {exc}{hint}", file=sys.stderr)
        return 1
    if args.json:
        print_json(out)
    else:
        print(out["reply"])
    return 0
