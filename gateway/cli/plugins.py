"""``tidegate plugins list [--json]`` and ``tidegate plugins doctor``: the installed
``tidegate.channels`` / ``tidegate.tools`` / ``tidegate.providers`` plugins
(``runtime/plugins.py``), the built-ins included. Neither needs the config or a running
gateway: they show what this installation would load."""

from __future__ import annotations

import argparse
from typing import Any

from gateway.cli.output import print_json, quiet_logs


def _rows() -> list[dict[str, Any]]:
    from channels import registry
    from runtime import plugins
    registry.channel_plugins()  # load and check every channel plugin
    rows = []
    for kind in plugins.GROUPS:
        for info in plugins.discover(kind):
            if kind != "channel":
                plugins.load(info)
            row = info.as_dict()
            caps = getattr(info.value, "capabilities", None)
            if caps is not None and hasattr(caps, "as_dict"):
                row["capabilities"] = caps.as_dict()
            rows.append(row)
    return rows


@quiet_logs(level="error")
def list_plugins(args: argparse.Namespace, loaded: Any) -> int:
    """One line per plugin: name, kind, version, source (builtin | package), state."""
    rows = _rows()
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no plugins installed")
    for r in rows:
        state = "" if r["state"] == "loaded" else f"  [{r['state']}]"
        print(f"{r['name']:<14} {r['kind']:<9} {r['version']:<10} {r['source']:<8} "
              f"{r['package']}{state}")
    return 0


@quiet_logs(level="error")
def doctor(args: argparse.Namespace, loaded: Any) -> int:
    """Load every plugin; print each one's verdict and, for a failure, why (with the
    traceback of an import error). Exit 1 when any plugin cannot be used."""
    from runtime import plugins
    from runtime.plugins import SDK_VERSION
    rows = _rows()
    print(f"plugin SDK {SDK_VERSION}; {len(rows)} plugin(s) installed")
    bad = 0
    for r in rows:
        if r["state"] != "failed" and r["kind"] == "channel":
            broken = _model_problem(r["name"])
            if broken:
                r = {**r, "state": "failed", "error": broken}
        if r["state"] != "failed":
            print(f"ok    {r['kind']} {r['name']} ({r['package']} {r['version']}, "
                  f"SDK {r['sdk_version']})")
            continue
        bad += 1
        print(f"FAIL  {r['kind']} {r['name']} ({r['package']} {r['version']}): {r['error']}")
        info = plugins.find(r["kind"], r["name"])
        if info is not None and info.detail:
            print("      " + info.detail.rstrip().replace("\n", "\n      "))
    print("all plugins load" if not bad else f"{bad} plugin(s) cannot be used; the others "
          "run (a broken plugin disables only itself)")
    return 1 if bad else 0


def _model_problem(name: str) -> str | None:
    """What is wrong with channel plugin ``name``'s config model, or None."""
    from channels import registry
    from channels.config import check_config_model
    plugin = registry.channel_plugins().get(name)
    return check_config_model(name, plugin.config) if plugin is not None else None


def register(sub: Any) -> None:
    p = sub.add_parser("plugins", help="installed channel, tool and provider plugins")
    psub = p.add_subparsers(dest="plugins_cmd", required=True)
    ls = psub.add_parser("list", help="every plugin: name, kind, version, source")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=list_plugins, raw_config=True)
    dr = psub.add_parser("doctor", help="load every plugin and say why one cannot be used",
                         epilog="Exit 1 when a plugin fails to load or targets another "
                                "SDK major version.")
    dr.set_defaults(func=doctor, raw_config=True)
