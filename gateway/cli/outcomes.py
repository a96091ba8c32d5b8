"""``tidegate sessions outcomes [KEY] [--since WHEN]`` and ``tidegate channels dead-letters
list|show|resubmit|drop`` (docs/outcomes.md). Listing asks the running gateway and reads
the intake journal when none runs; resubmit and drop need the running gateway (it owns
the journal and the session's lane)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from gateway.cli.fast_start import nonneg_int, when_parser

if TYPE_CHECKING:
    from gateway.config.load import LoadedConfig


def add_sessions_outcomes(ssub: Any) -> None:
    """``sessions outcomes`` under the ``sessions`` subparsers ``ssub``."""
    so = ssub.add_parser("outcomes", help="the outcome of each accepted message "
                         "(replied, silent, refused, failed, interrupted, dead-lettered)")
    so.add_argument("key", metavar="KEY", nargs="?", help="only this session key")
    so.add_argument("--since", type=when_parser(time.time()), metavar="WHEN",
                    help="only outcomes at or after WHEN: 10m, 2h, 7d ago, an RFC 3339 "
                         "time or a local date YYYY-MM-DD[ HH:MM]")
    so.add_argument("-n", "--limit", type=nonneg_int, default=200,
                    help="the newest N (default 200; 0: all)")
    so.add_argument("--json", action="store_true", help="machine-readable JSON")


def add_dead_letters(csub: Any) -> None:
    """``channels dead-letters list|show|resubmit|drop`` under the ``channels``
    subparsers ``csub``."""
    d = csub.add_parser("dead-letters", help="messages set aside after failing the same "
                        "way 3 times")
    dsub = d.add_subparsers(dest="dead_cmd", required=True)
    dl = dsub.add_parser("list", help="the dead letters, oldest first")
    dl.add_argument("--json", action="store_true", help="machine-readable JSON")
    for name, text in (("show", "one dead letter with its whole message"),
                       ("resubmit", "accept it again as a new message (needs the gateway)"),
                       ("drop", "forget it; its outcome row stays (needs the gateway)")):
        p = dsub.add_parser(name, help=text)
        p.add_argument("id", metavar="ID", help="its id (or a unique prefix of 4+ characters)")
        p.add_argument("--json", action="store_true", help="machine-readable JSON")
    d.set_defaults(func=cmd_dead_letters)


def _api(loaded: LoadedConfig, method: str, path: str) -> Any:
    from gateway.cli.client import ControlClient
    return ControlClient.from_config(loaded).request(method, path, timeout=30)


def _offline(loaded: LoadedConfig) -> Any:
    from gateway.journal.outcomes import read_rows
    from gateway.journal.store import FILE_NAME
    return read_rows(loaded.state_dir / FILE_NAME)


def cmd_sessions_outcomes(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.client import GatewayUnavailable
    from gateway.cli.output import print_json
    from gateway.routing import canonical_key, readable_key
    from runtime.clock import utc_iso
    key = canonical_key(args.key) if args.key else None
    query = {k: v for k, v in (("session_key", key), ("since", args.since),
                               ("limit", args.limit or None)) if v is not None}
    try:
        rows = _api(loaded, "GET", f"/api/outcomes?{urlencode(query)}")["outcomes"]
    except GatewayUnavailable:
        rows = _offline(loaded).select(key, args.since, args.limit or None)
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no outcomes recorded" + (f" for {readable_key(key)}" if key else ""))
        return 0
    for r in rows:
        detail = f"  {r['detail']}" if r.get("detail") else ""
        print(f"{utc_iso(float(r.get('ts') or 0))}  {r.get('outcome'):<13}  "
              f"{readable_key(r.get('session_key') or '')}  "
              f"{r.get('channel') or '-'}:{r.get('message_id') or '-'}"
              f"{detail}")
    return 0


def cmd_dead_letters(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.client import ApiError, GatewayUnavailable
    from gateway.cli.output import print_json
    from runtime.clock import utc_iso
    try:
        out = _dead_letters(args, loaded)
    except GatewayUnavailable as exc:
        print(f"error: {exc} ({args.dead_cmd} needs the running gateway)", file=sys.stderr)
        return 1
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if out is None:
        print(f"error: no dead letter {args.id!r} (see `tidegate channels dead-letters "
              "list`)", file=sys.stderr)
        return 1
    if args.json:
        print_json(out)
    elif args.dead_cmd == "list":
        if not out:
            print("no dead letters")
        for d in out:
            print(f"{d['id']}  {utc_iso(float(d.get('ts') or 0))}  {d.get('session_key')}  "
                  f"{', '.join(d.get('crashes') or [])}  {_short(d.get('text', ''))}")
    elif args.dead_cmd == "show":
        for k in ("id", "session_key", "channel", "message_id", "ts", "detail"):
            print(f"{k}: {utc_iso(float(out[k] or 0)) if k == 'ts' else out.get(k)}")
        print(f"crashes: {', '.join(out.get('crashes') or [])}")
        print(f"text: {(out.get('work') or {}).get('text', '')}")
    elif args.dead_cmd == "resubmit":
        print(f"resubmitted {out['id']} as {out['new_entry_id']}")
    else:
        print(f"dropped {out['id']}")
    return 0


def _dead_letters(args: argparse.Namespace, loaded: LoadedConfig) -> Any:
    """The answer of the dead-letter command, None for an unknown id."""
    from gateway.cli.client import ApiError, GatewayUnavailable
    from gateway.journal import dead_letters
    if args.dead_cmd in ("list", "show"):
        path = "/api/dead-letters" + (f"/{quote(args.id, safe='')}"
                                      if args.dead_cmd == "show" else "")
        try:
            out = _api(loaded, "GET", path)
        except GatewayUnavailable:
            rows = _offline(loaded)
            return [{**{k: v for k, v in d.items() if k != "work"},
                     "text": (d.get("work") or {}).get("text", "")}
                    for d in rows.dead.values()] if args.dead_cmd == "list" \
                else dead_letters.find(rows_journal(rows), args.id)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return out["dead_letters"] if args.dead_cmd == "list" else out
    method = "POST" if args.dead_cmd == "resubmit" else "DELETE"
    suffix = "/resubmit" if args.dead_cmd == "resubmit" else ""
    try:
        return _api(loaded, method, f"/api/dead-letters/{quote(args.id, safe='')}{suffix}")
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def rows_journal(rows: Any) -> Any:
    """An object with ``outcomes`` (what dead_letters.find reads) over ``rows``."""
    return argparse.Namespace(outcomes=rows)


def _short(text: str, n: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"
