"""``tidegate channels status [--probe]``: each channel's state from the running gateway
(state, last error, outbox backlog), and with ``--probe`` each enabled account's live
credential check, the probe its channel plugin offers (``ChannelPlugin.probe``: Telegram
``getMe``, Slack ``auth.test``, Discord ``GET /users/@me``, WhatsApp the phone-number
lookup, Matrix ``whoami``, email an IMAP and an SMTP login) — which works without the
gateway too (it reads the credentials from the config and ``--env-file``). A plugin
without a probe is listed as skipped; exit 1 when a check failed."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from gateway.cli.output import human, print_json
from gateway.config.load import LoadedConfig


def register(sub: Any) -> None:
    c = sub.add_parser("channels", help="chat platform channels")
    csub = c.add_subparsers(dest="channels_cmd", required=True)
    st = csub.add_parser("status", help="state, last error and outbox of each channel")
    st.add_argument("--probe", action="store_true",
                    help="also check each account's credentials live, with the check its "
                         "channel plugin offers (a login or an identity call)")
    st.add_argument("--env-file", metavar="PATH", default=argparse.SUPPRESS,
                    help="read the tokens' ${VARS} from this systemd EnvironmentFile "
                         "(as the global --env-file)")
    st.add_argument("--json", action="store_true", help="machine-readable JSON")
    st.set_defaults(func=cmd_channels_status)
    from gateway.cli.outcomes import add_dead_letters
    add_dead_letters(csub)


def probe_account(name: str, account: Any, timeout: float = 10.0) -> tuple[bool | None, str]:
    """The live check of one account of channel plugin ``name``
    (``channels.probing.check_account``): ``(ok, detail)``, ``ok`` None when the plugin
    offers no probe. Never raises."""
    from channels.probing import check_account
    from channels.registry import channel_plugin
    plugin = channel_plugin(name)
    if plugin is None:
        return False, f"channel plugin {name!r} is not installed or failed to load"
    return asyncio.run(check_account(plugin, account, timeout))


def probes(loaded: LoadedConfig) -> dict[str, dict[str, Any]]:
    """Live checks of every enabled account of every installed channel plugin:
    ``{"<name>[:<account>]": {"ok": bool | None, "detail": str}}`` (``ok`` None: the
    plugin has no probe)."""
    from channels.registry import channel_names
    from channels.sections import account_configs
    out = {}
    for platform in channel_names():
        section = loaded.config.channels.platform(platform)
        if section is None or not section.enabled:
            continue
        for account, acc in account_configs(section).items():
            name = platform if account == "default" else f"{platform}:{account}"
            ok, detail = probe_account(platform, acc)
            out[name] = {"ok": ok, "detail": detail}
    return out


def cmd_channels_status(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.client import ApiError, ControlClient, GatewayUnavailable
    try:
        st = ControlClient.from_config(loaded).request("GET", "/status", timeout=10)
        channels, outbox = st.get("channels", {}), st.get("outbox", {})
        running = True
    except (GatewayUnavailable, ApiError) as exc:
        channels, outbox, running = {}, {}, False
        if not args.probe:
            print(f"gateway: not running ({exc}); --probe checks the tokens anyway",
                  file=sys.stderr)
            return 1
    checked = probes(loaded) if args.probe else {}
    if args.json:
        print_json({"running": running, "channels": channels, "outbox": outbox,
                    "probes": checked})
    else:
        for name, ch in channels.items():
            err = f"; last error: {ch['last_error']}" if ch.get("last_error") else ""
            print(f"{name}: {human(ch.get('state'))}{err}")
        if running:
            print(f"outbox: {outbox.get('pending', 0)} pending")
        for name, p in checked.items():
            mark = {True: "ok", False: "FAILED", None: "skipped"}[p["ok"]]
            print(f"probe {name}: {mark} — {p['detail']}")
    return 1 if any(p["ok"] is False for p in checked.values()) else 0
