"""``tidegate backup create|verify|restore``: verified backups of the state dir
(gateway/backup). They work with the gateway running or stopped; with it running,
``create`` asks it (``POST /api/backup``) so the archive is taken at one instant
(gateway/backup/cut.py), and writes the archive itself when no gateway runs for the
state dir or the one that runs does not answer ``/healthz`` within HELLO_TIMEOUT_S
(stopped, wedged): a note on stderr says so.

Exit codes: 0 ok, 1 failure (the first problem named on stderr), 2 bad usage (a restore
into a non-empty directory).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gateway.cli.output import plural, print_json
from gateway.config.load import LoadedConfig

# seconds the running gateway has to answer /healthz before the files are read here
HELLO_TIMEOUT_S = 3.0


def register(sub: Any) -> None:
    b = sub.add_parser("backup", help="verified backups: create, verify, restore")
    bsub = b.add_subparsers(dest="backup_cmd", required=True)
    c = bsub.add_parser("create", help="archive the state dir (while the gateway runs: "
                        "through it, at one instant)")
    c.add_argument("--to", metavar="FILE", help="write here, outside the state dir "
                   "(default: a new tidegate-backup-<time>-manual.tar.gz in backup.dir, "
                   "which rotation never deletes)")
    c.add_argument("--force", action="store_true",
                   help="replace an existing archive at --to (never a device, directory "
                   "or symlink)")
    c.add_argument("--include-secrets", action="store_true",
                   help="also tidegate.env and gateway.token (the archive is 0600 anyway)")
    c.add_argument("--json", action="store_true")
    v = bsub.add_parser("verify", help="check every hash, database and timeline chain")
    v.add_argument("file", metavar="FILE", help="the backup archive (.tar.gz)")
    v.add_argument("--json", action="store_true")
    r = bsub.add_parser("restore", help="unpack into an empty state dir, then verify it")
    r.add_argument("file", metavar="FILE", help="the backup archive (.tar.gz)")
    r.add_argument("--state-dir", required=True, metavar="DIR",
                   help="the empty (or new) directory to restore into")
    r.add_argument("--dsn", metavar="URL",
                   help="a backup of PostgreSQL storage: the empty database to load it "
                   "into (default: storage.dsn of the config)")
    r.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_backup)


def cmd_backup(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    if args.backup_cmd == "create":
        return _create(args, loaded)
    return _verify(args) if args.backup_cmd == "verify" else _restore(args, loaded)


def _create(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.backup.archive import BackupError
    from gateway.cli.client import ApiError
    secrets = True if args.include_secrets else None
    dest = os.path.abspath(Path(args.to).expanduser()) if args.to else None
    try:
        made = _through_gateway(loaded, dest, secrets, args.force)
        if made is None:  # no gateway runs for this state dir: read the files here
            made = _offline(loaded, dest, secrets, args.force)
    except (BackupError, ApiError) as exc:
        print(f"error: backup failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json(made)
        return 0
    cut = made.get("cut")
    how = f", taken at one instant by the running gateway (its writers held " \
          f"{cut['hold_ms']:.1f} ms)" if cut else ""
    print(f"backup written: {made['file']} ({made['bytes']} bytes, "
          f"{plural(made['files'], 'file')}, timeline: "
          f"{plural(made['timeline_sessions'], 'session')}, "
          f"{plural(made['timeline_events'], 'event')}){how}")
    if made["secrets"]:
        print("note: this archive CONTAINS SECRETS (tidegate.env, gateway.token); it is "
              "mode 0600 — keep it as safe as the state dir")
    elif made["secrets_left_out"]:
        print(f"secrets left out: {', '.join(made['secrets_left_out'])} "
              "(--include-secrets to keep them)")
    return 0


def _through_gateway(loaded: LoadedConfig, dest: str | None, secrets: bool | None,
                     force: bool) -> dict[str, Any] | None:
    """The running gateway's answer to ``POST /api/backup`` (None: no gateway runs for
    this state dir). Raises ApiError with the gateway's message (the backup failed)."""
    from gateway.cli.client import ApiError, ControlClient, GatewayUnavailable
    client = ControlClient.from_config(loaded)
    if client.base_url is None:
        return None
    try:  # a stopped (SIGSTOP) or wedged gateway must not hold us for the long wait
        client.request("GET", "/healthz", timeout=HELLO_TIMEOUT_S)
    except GatewayUnavailable as exc:
        print(f"note: the gateway does not answer ({exc}); the files are read here, one "
              "after another", file=sys.stderr)
        return None
    except ApiError:
        pass  # it answers: the backup request below says what is wrong
    try:  # it answered: the long wait is for the backup itself
        return client.request("POST", "/api/backup", {"to": dest, "force": force,
                                                      "include_secrets": secrets})
    except GatewayUnavailable:
        return None  # it stopped meanwhile (or was never ours): the files are read here
    except ApiError as exc:
        if exc.status != 404:
            raise
        print("note: the running gateway is older than this tidegate (no backup API): "
              "the files are read one after another", file=sys.stderr)
        return None


def _offline(loaded: LoadedConfig, dest: str | None, secrets: bool | None,
             force: bool) -> dict[str, Any]:
    from gateway.backup.service import run_backup
    made = run_backup(loaded.config, loaded.state_dir,
                      dest=Path(dest) if dest else None, include_secrets=secrets,
                      overwrite=force)
    tl = made.timeline or {}
    return {"ok": True, "file": str(made.path), "bytes": made.bytes, "files": made.files,
            "secrets": made.secrets, "secrets_left_out": made.secrets_left_out,
            "timeline_sessions": tl.get("sessions", 0),
            "timeline_events": tl.get("events", 0), "cut": None}


def _report(out: Any, as_json: bool, what: str) -> int:
    if as_json:
        print_json({"ok": out.ok, "problems": out.problems, "files": out.files,
                    "databases": out.databases, "timeline_sessions": out.sessions,
                    "timeline_events": out.events, "notes": out.notes})
    if not out.ok:
        more = f" (and {len(out.problems) - 1} more)" if len(out.problems) > 1 else ""
        print(f"error: {what} failed: {out.problems[0]}{more}", file=sys.stderr)
        return 1
    if not as_json:
        print(f"{what} OK: {plural(out.files, 'file')} match the manifest, "
              f"{plural(out.databases, 'database')} open, timeline: "
              f"{plural(out.sessions, 'session')}, {plural(out.events, 'event')} verified")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from gateway.backup.check import verify_archive
    return _report(verify_archive(Path(args.file).expanduser()), args.json, "verify")


def _restore(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.backup.check import RestoreRefused, restore
    target = Path(args.state_dir).expanduser()
    storage = loaded.config.storage
    dsn = args.dsn or (storage.dsn if storage.backend == "postgres" else None)
    try:
        out = restore(Path(args.file).expanduser(), target, dsn)
    except RestoreRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    code = _report(out, args.json, "restore")
    if code == 0 and not args.json:
        manifest = out.manifest or {}
        db = ""
        if manifest.get("postgres") and dsn:
            from runtime.storage.postgres.pool import redact_dsn
            db = f" and storage.dsn: {redact_dsn(dsn)}"
        print(f"restored into {target}; start the gateway with gateway.state_dir: {target}"
              + db + ("" if manifest.get("secrets") else
                 " (secrets were not in the backup: put tidegate.env back yourself; a new "
                 "gateway.token is made at start)"))
        for note in out.notes:
            print(f"note: {note}")
    return code
