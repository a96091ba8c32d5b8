"""``tidegate tools list|explain|check`` (issue 11; seed 001 §4).

``explain --agent A [--provider P] [--channel C] [--account X] [--group G] [--subagent]``
prints the final tool set of that scope and, for every removed tool, the layer and the
entry that removed it; ``check`` prints the config's unknown-entry diagnostics (exit 1
when there are any). Both are computed from the config file and the built-in tools, so
they work without a running gateway (plugin tools appear only in a running gateway).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.cli.output import print_json, quiet_logs
from gateway.config.load import LoadedConfig

# The tool registry pulls in every tool module (web, memory search, ...): imported when a
# tools command runs, not when the CLI builds its parser (`agent -m` stays fast).


LOCAL_CHANNELS = ("webchat", "cli")


def _platforms() -> list[str]:
    from channels import registry
    return registry.channel_names()


def _unknown(kind: str, value: str, known: list[str]) -> str:
    from difflib import get_close_matches
    close = get_close_matches(value, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {value!r} (known: {', '.join(known) or 'none'}){hint}"


def _check_target(args: argparse.Namespace, cfg: Any) -> list[str]:
    """Validate ``--provider``, ``--channel`` and ``--account`` against the config.
    Returns warnings; raises KeyError with the error line."""
    if args.provider is not None:
        known = sorted({*cfg.models.providers, "echo"})
        if args.provider not in known:
            raise KeyError(_unknown("provider", args.provider, known))
    platforms = _platforms()
    if args.channel is not None and args.channel not in (*platforms, *LOCAL_CHANNELS):
        raise KeyError(_unknown("channel", args.channel, [*platforms, *LOCAL_CHANNELS]))
    if args.account is None:
        return []
    if args.channel not in platforms:
        raise KeyError(f"--account needs --channel {', '.join(platforms)}")
    section = getattr(cfg.channels, args.channel)
    if not section.enabled:
        return [(f"channels.{args.channel} is not enabled: account {args.account!r} is "
                 f"not checked; the policy is shown as it would apply")]
    known = sorted(section.accounts) if section.accounts else ["default"]
    if args.account not in known:
        raise KeyError(_unknown(f"{args.channel} account", args.account, known))
    return []


def _scope(args: argparse.Namespace, loaded: LoadedConfig) -> Any:
    from gateway.tools.policy import provider_of
    from runtime.tools.policy import ToolScope
    cfg = loaded.config
    agent = (args.agent or cfg.default_agent()).lower()
    cfg.agent(agent)  # KeyError for an unknown agent
    for line in _check_target(args, cfg):
        print(f"warning: {line}", file=sys.stderr)
    return ToolScope(agent, args.provider or provider_of(cfg, agent),
                     channel=args.channel, account=args.account or "default",
                     chat_type="group" if args.group else "dm", group_id=args.group,
                     subagent_depth=1 if args.subagent else 0)


@quiet_logs
def explain(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.tools.policy import build_policy, diagnostics
    from gateway.tools.services import gateway_registry
    registry = gateway_registry(loaded.config)
    try:
        scope = _scope(args, loaded)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    res = build_policy(loaded.config, registry).resolve(scope)
    problems = diagnostics(loaded.config, registry)
    out: dict[str, Any] = {
        "scope": {"agent": scope.agent_id, "provider": scope.provider,
                  "channel": scope.channel, "account": scope.account,
                  "group": scope.group_id, "subagent": scope.subagent_depth > 0},
        "tools": list(res.tools),
        "removed": [r.as_dict() for r in res.removed],
        "layers": [{"layer": la.number, "name": la.name, "path": la.path,
                    "allow": list(la.allow) if la.allow is not None else None,
                    "deny": list(la.deny)} for la in res.layers],
        "diagnostics": problems}
    if args.json:
        print_json(out)
        return 0
    where = f"{scope.channel or 'local'}" + (f" group {scope.group_id}" if scope.group_id
                                            else " dm")
    print(f"agent {scope.agent_id}, provider {scope.provider}, {where}"
          f"{' (subagent)' if scope.subagent_depth else ''}")
    print(f"tools ({len(res.tools)}): {', '.join(res.tools) or '(none)'}")
    for r in res.removed:
        print(f"  - {r.tool}: removed by layer {r.layer} ({r.layer_name}) {r.path}: "
              f"{r.entry}")
    for line in problems:
        print(f"diagnostic: {line}")
    return 0


@quiet_logs
def list_tools(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.tools.services import gateway_registry
    rows = [{"name": t.name, "source": t.source, "group": t.group,
             "side_effects": t.side_effects,
             "platforms": sorted(t.platforms) if t.platforms else None}
            for t in gateway_registry(loaded.config).assembled()]
    if args.json:
        print_json(rows)
        return 0
    for r in rows:
        only = f" (only {', '.join(r['platforms'])})" if r["platforms"] else ""
        print(f"{r['name']:<18} {r['source']:<11} {r['group'] or '-':<17} "
              f"{'side effects' if r['side_effects'] else ''}{only}")
    return 0


@quiet_logs
def check(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.tools.policy import diagnostics
    from gateway.tools.services import gateway_registry
    problems = diagnostics(loaded.config, gateway_registry(loaded.config))
    if args.json:
        print_json({"diagnostics": problems})
    else:
        for line in problems:
            print(f"diagnostic: {line}")
        if not problems:
            print("tool policy OK: every entry matches a known tool or group")
    return 1 if problems else 0


def register(sub: Any) -> None:
    t = sub.add_parser("tools", help="tool sources and the tool policy")
    tsub = t.add_subparsers(dest="tools_cmd", required=True)
    ex = tsub.add_parser("explain", help="the final tool set of a scope, and why",
                         epilog="Exit 2 for an unknown --agent, --provider, --channel or "
                                "--account (with a \"did you mean\").")
    ex.add_argument("--agent", help="agent id (default: the default agent)")
    ex.add_argument("--provider", help="model provider (default: the agent's primary model's)")
    ex.add_argument("--channel", help="channel, e.g. telegram (default: local)")
    ex.add_argument("--account", help="channel account (default: default)")
    ex.add_argument("--group", metavar="GROUP_ID",
                    help="a group chat id (default: a direct message)")
    ex.add_argument("--subagent", action="store_true", help="as a subagent run of that scope")
    ex.add_argument("--json", action="store_true")
    ex.set_defaults(func=explain)
    ls = tsub.add_parser("list", help="every built-in tool with source and group")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=list_tools)
    ck = tsub.add_parser("check", help="unknown policy entries in the config")
    ck.add_argument("--json", action="store_true")
    ck.set_defaults(func=check)
