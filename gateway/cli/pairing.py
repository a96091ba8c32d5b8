"""``tidegate pairing``: list, approve and revoke DM pairing requests (issue 3, DM policy
``pairing``).

The commands work on ``channels.access.pairing.PairingStore`` directly: its files are locked and
replaced atomically, and the daemon re-reads them when they change, so an approval takes
effect in a running gateway at once (no restart, no control API needed). When the gateway
is running, ``approve`` also asks it to greet the sender (``POST /api/pairing/approved``,
gateway/channels/boot.py); that is best effort.

Exit codes: 0 ok, 1 nothing matched (unknown code, sender not paired), 2 bad input (a
channel other than an installed chat platform (telegram, slack, discord, matrix, plugins):
refused before any file is touched).

The command prints its own results; the store's structlog events (``pairing_approved``...)
are for the daemon's log, so only warnings and errors reach stderr here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from channels.access.pairing import PairingRequest, PairingStore, PairingUnavailable
from gateway.cli.output import print_json
from gateway.config.load import LoadedConfig
from runtime.clock import SYSTEM_CLOCK, format_elapsed, utc_iso


def register(sub: Any) -> None:
    """Add the ``pairing`` command group to the CLI's subparsers (gateway/cli/main.py)."""
    p = sub.add_parser("pairing", help="DM pairing: list, approve or revoke senders")
    psub = p.add_subparsers(dest="pairing_cmd", required=True, metavar="ACTION")
    ls = psub.add_parser("list", help="pending pairing requests (and approved senders)")
    ls.add_argument("--channel", help="only this channel (telegram, slack, discord, matrix, ...)")
    ls.add_argument("--approved", action="store_true",
                    help="list approved senders instead of pending requests")
    ls.add_argument("--json", action="store_true")
    ap = psub.add_parser("approve", help="approve a pending code")
    ap.add_argument("channel", help="telegram, slack, discord, whatsapp, matrix or another installed chat platform")
    ap.add_argument("code", help="the pairing code the sender received")
    rv = psub.add_parser("revoke", help="remove a sender's approval and pending codes")
    rv.add_argument("channel", help="telegram, slack, discord, whatsapp, matrix or another installed chat platform")
    rv.add_argument("sender_id", metavar="SENDER_ID", help="the platform user id to revoke")
    p.set_defaults(func=cmd_pairing)


def pairing_channels() -> tuple[str, ...]:
    """The channels with a ``pairing`` DM policy: every chat platform plugin installed
    (channels/registry.py); any other name is a typo, not a new file."""
    from channels import registry
    return tuple(sorted(registry.channel_plugins()))


def _channel(name: str) -> str:
    """The normalised channel name. Raises ValueError for anything but a chat platform."""
    channel, known = name.strip().lower(), pairing_channels()
    if channel not in known:
        raise ValueError(f"invalid channel name {name!r}: pairing is for "
                         + ", ".join(known))
    return channel


def cmd_pairing(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    """Run one ``tidegate pairing`` action; returns the exit code."""
    from gateway.logs.pipeline import configure_logging, reset_logging
    from gateway.service.storage import offline_records

    # Warnings only, on stderr: stdout carries the command's output (often JSON).
    configure_logging(state_dir=None, level="warning")
    try:
        store = PairingStore(loaded.state_dir, SYSTEM_CLOCK,
                             records=offline_records(loaded, "pairing"))
        if args.pairing_cmd == "list":
            return _list(store, args)
        if args.pairing_cmd == "approve":
            return _approve(store, loaded, _channel(args.channel), args.code)
        return _revoke(store, _channel(args.channel), args.sender_id.strip())
    except ValueError as exc:  # an invalid channel name
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except PairingUnavailable as exc:  # a corrupt pairing file: name it and the fix
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        reset_logging()


def request_json(r: PairingRequest) -> dict[str, Any]:
    """A pending request as printed by ``pairing list --json`` (times RFC 3339 UTC)."""
    return {"channel": r.channel, "code": r.code, "account_id": r.account_id,
            "sender_id": r.sender_id, "sender_name": r.sender_name,
            "created_at": utc_iso(r.created_at), "expires_at": utc_iso(r.expires_at)}


def _list(store: PairingStore, args: argparse.Namespace) -> int:
    channel = _channel(args.channel) if args.channel else None
    if args.approved:
        channels = [channel] if channel else _channels(store)
        rows = [{"channel": ch, **a} for ch in channels for a in store.list_approved(ch)]
        if args.json:
            print_json(rows)
            return 0
        if not rows:
            print("no approved senders")
        for a in rows:
            name = f" ({a['sender_name']})" if a.get("sender_name") else ""
            print(f"{a['channel']:<9} {a['sender_id']}{name} account {a['account_id']}, "
                  f"approved {a['approved_at']}")
        return 0
    pending = store.list_pending(channel)
    if args.json:
        print_json([request_json(r) for r in pending])
        return 0
    if not pending:
        print("no pending pairing requests")
        return 0
    now = SYSTEM_CLOCK.time()
    print(f"{'CHANNEL':<9} {'CODE':<8}  {'SENDER':<24} EXPIRES IN")
    for r in pending:
        who = r.sender_id + (f" ({r.sender_name})" if r.sender_name else "")
        acct = "" if r.account_id == "default" else f" [account {r.account_id}]"
        print(f"{r.channel:<9} {r.code:<8}  {who + acct:<24} "
              f"{format_elapsed(max(0.0, r.expires_at - now))}")
    print("approve with: tidegate pairing approve <channel> <code>")
    return 0


def _channels(store: PairingStore) -> list[str]:
    if not store.dir.exists():
        return []
    known = pairing_channels()
    return sorted(p.stem for p in store.dir.glob("*.json") if p.stem in known)


def _approve(store: PairingStore, loaded: LoadedConfig, channel: str, code: str) -> int:
    req = store.approve(channel, code)
    if req is None:
        print(f"error: no pending pairing request with code {code!r} on {channel} (codes "
              f"expire after an hour; see `tidegate pairing list`)", file=sys.stderr)
        return 1
    name = f" ({req.sender_name})" if req.sender_name else ""
    print(f"approved {channel} sender {req.sender_id}{name} on account {req.account_id}")
    _greet(loaded, req)
    return 0


def _greet(loaded: LoadedConfig, req: PairingRequest) -> None:
    """Ask a running gateway to tell the sender (best effort, quiet when it is down)."""
    from gateway.cli.client import ApiError, ControlClient, GatewayUnavailable
    try:
        out = ControlClient.from_config(loaded).request(
            "POST", "/api/pairing/approved",
            {"channel": req.channel, "sender_id": req.sender_id,
             "account_id": req.account_id}, timeout=10)
    except GatewayUnavailable:
        print("gateway not running: the sender is recognised from their next message")
        return
    except ApiError as exc:
        if exc.status == 404:  # a gateway without the route: nothing to tell
            print("the sender is recognised from their next message")
        else:
            print(f"note: could not notify the sender ({exc})")
        return
    if out and out.get("ok"):
        print("the sender was notified")
    else:
        print(f"note: the notification is queued for retry ({(out or {}).get('error')})")


def _revoke(store: PairingStore, channel: str, sender_id: str) -> int:
    if not store.revoke(channel, sender_id):
        print(f"error: {channel} sender {sender_id!r} is neither approved nor pending",
              file=sys.stderr)
        return 1
    print(f"revoked {channel} sender {sender_id}")
    return 0
