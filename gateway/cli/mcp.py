"""``tidegate mcp list [--json]``: each configured MCP server's state, last error and the
tools it exposes (from the running gateway's ``GET /api/mcp``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.cli.output import print_json
from gateway.config.load import LoadedConfig


def register(sub: Any) -> None:
    """Add the ``mcp`` command group to the CLI's subparsers (gateway/cli/main.py)."""
    p = sub.add_parser("mcp", help="MCP servers: state and tools")
    psub = p.add_subparsers(dest="mcp_cmd", required=True, metavar="ACTION")
    ls = psub.add_parser("list", help="servers, their state, last error and tools",
                         epilog="Exit 1 when a server is down.")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_mcp_list)


def cmd_mcp_list(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.client import ApiError, ControlClient, GatewayUnavailable

    try:
        servers = ControlClient.from_config(loaded).request("GET", "/api/mcp", timeout=10)
    except (GatewayUnavailable, ApiError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json(servers)
        return 0
    if not servers:
        print("no MCP servers configured (mcp.servers)")
    for name, s in servers.items():
        err = f" — {s['last_error']}" if s.get("last_error") else ""
        print(f"{name} [{s['transport']}]: {s['state']}{err}")
        for tool in s.get("tools") or []:
            print(f"  {tool}")
    failed = [n for n, s in servers.items() if s["state"] in ("failed", "reconnecting")]
    return 1 if failed else 0
