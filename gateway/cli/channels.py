"""``tidegate channels status [--probe]``: each channel's state from the running gateway
(state, last error, outbox backlog), and with ``--probe`` a live token check against the
platform — Telegram ``getMe``, Slack ``auth.test``, Discord ``GET /users/@me`` — which
works without the gateway too (it reads the tokens from the config and ``--env-file``)."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from gateway.cli.output import human, print_json
from gateway.config.load import LoadedConfig


def register(sub: Any) -> None:
    c = sub.add_parser("channels", help="chat platform channels")
    csub = c.add_subparsers(dest="channels_cmd", required=True)
    st = csub.add_parser("status", help="state, last error and outbox of each channel")
    st.add_argument("--probe", action="store_true",
                    help="also check each platform token live (getMe, auth.test, /users/@me)")
    st.add_argument("--env-file", metavar="PATH", default=argparse.SUPPRESS,
                    help="read the tokens' ${VARS} from this systemd EnvironmentFile "
                         "(as the global --env-file)")
    st.add_argument("--json", action="store_true", help="machine-readable JSON")
    st.set_defaults(func=cmd_channels_status)
    from gateway.cli.outcomes import add_dead_letters
    add_dead_letters(csub)


def probe_token(platform: str, api_base: str, token: str, timeout: float = 10.0
                ) -> tuple[bool, str]:
    """One live identity call; returns (ok, what it said). Never raises."""
    base = api_base.rstrip("/")
    if platform == "telegram":
        req = urllib.request.Request(f"{base}{token}/getMe")
    elif platform == "slack":
        req = urllib.request.Request(f"{base}/auth.test", data=b"", method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
    else:
        req = urllib.request.Request(f"{base}/users/@me",
                                     headers={"Authorization": f"Bot {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code} (token rejected)" if exc.code in (401, 403) \
            else f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, f"unreachable: {getattr(exc, 'reason', exc)}"
    if platform == "telegram":
        ok = bool(body.get("ok"))
        who = (body.get("result") or {}).get("username")
        return ok, f"bot @{who}" if ok else str(body.get("description"))
    if platform == "slack":
        ok = bool(body.get("ok"))
        return ok, f"bot {body.get('user')} in {body.get('team')}" if ok else \
            str(body.get("error"))
    return "id" in body, f"bot {body.get('username')}" if "id" in body else str(body)


def probes(loaded: LoadedConfig) -> dict[str, dict[str, Any]]:
    """Live token checks of every enabled platform account."""
    from channels.config import account_configs
    out = {}
    for platform in ("telegram", "slack", "discord"):
        section = getattr(loaded.config.channels, platform)
        if not section.enabled:
            continue
        for account, acc in account_configs(section).items():
            token = acc.bot_token if platform == "slack" else acc.token
            name = platform if account == "default" else f"{platform}:{account}"
            if not token or "${" in token:
                out[name] = {"ok": False, "detail": "token not set (see --env-file)"}
                continue
            ok, detail = probe_token(platform, acc.api_base_url, token)
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
            print(f"probe {name}: {'ok' if p['ok'] else 'FAILED'} — {p['detail']}")
    return 0 if all(p["ok"] for p in checked.values()) else 1
