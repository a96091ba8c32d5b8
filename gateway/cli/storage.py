"""``tidegate storage migrate|status``: the PostgreSQL schema of ``storage.dsn``.

``migrate`` applies pending migrations under the advisory lock (safe while replicas run;
the gateway also does it at start). ``status`` lists every migration's state without
changing anything. Both exit 2 when ``storage.backend`` is not ``postgres``, 1 when the
database is unreachable or a migration is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from gateway.cli.output import print_json
from gateway.config.load import LoadedConfig


def register(sub: Any) -> None:
    s = sub.add_parser("storage", help="storage backend: schema migrations and status")
    ssub = s.add_subparsers(dest="storage_cmd", required=True)
    for name, what in (("migrate", "apply pending PostgreSQL schema migrations"),
                       ("status", "the PostgreSQL schema's migrations and their state")):
        p = ssub.add_parser(name, help=what, epilog="Exit 1 while a migration is pending or "
                            "was changed after it was applied (status), or when one fails "
                            "(migrate); exit 2 on embedded storage.")
        p.add_argument("--json", action="store_true", help="machine-readable JSON")
    c = ssub.add_parser("copy", help="copy this host's embedded state into the (empty) "
                        "PostgreSQL database of storage.dsn and verify it; refused while "
                        "the gateway runs",
                        epilog="Exit 0 only when every copied row and chain verifies; exit 1 "
                               "when a check fails, the database already holds tidegate rows "
                               "or a gateway runs on the state dir; exit 2 when storage.dsn is not "
                               "set.")
    c.add_argument("--from", dest="source", choices=["embedded"], required=True,
                   metavar="BACKEND", help="where the state is now: embedded")
    c.add_argument("--to", dest="target", choices=["postgres"], required=True,
                   metavar="BACKEND", help="where it goes: postgres (storage.dsn)")
    c.add_argument("--json", action="store_true", help="machine-readable JSON report")
    s.set_defaults(func=cmd_storage)


def cmd_storage(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.logs.pipeline import configure_logging, reset_logging
    configure_logging(state_dir=None, level="warning")  # stdout is the command's output
    try:
        return _cmd(args, loaded)
    finally:
        reset_logging()


def _cmd(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    section = loaded.config.storage
    if args.storage_cmd == "copy":
        from gateway.cli.storage_copy import cmd_copy
        return cmd_copy(args, loaded)
    if section.backend != "postgres":
        print("error: storage.backend is embedded (files and SQLite under "
              f"{loaded.state_dir}); there is no schema to migrate. Set storage.backend: "
              "postgres and storage.dsn first.", file=sys.stderr)
        return 2
    from runtime.storage.postgres.errors import StorageStartError
    try:
        return asyncio.run(_run(args, section))
    except StorageStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace, section: Any) -> int:
    from runtime.storage.postgres import migrate as mig
    from runtime.storage.postgres.pool import open_pool, redact_dsn
    one = section.model_copy(update={"pool": section.pool.model_copy(
        update={"min": 1, "max": 1})})
    pool = await open_pool(one)
    try:
        async with pool.acquire() as conn:
            applied = await mig.migrate(conn) if args.storage_cmd == "migrate" else None
            states = await mig.status(conn)
            server = await conn.fetchval("SHOW server_version")
    finally:
        await pool.close()
    rows = [{"version": s.version, "name": s.name, "state": s.state,
             "applied_at": s.applied_at} for s in states]
    bad = [s for s in states if s.state in ("pending", "modified")]
    if args.json:
        out: dict[str, Any] = {"dsn": redact_dsn(section.dsn), "server_version": server,
                               "migrations": rows, "up_to_date": not bad}
        if applied is not None:
            out["applied"] = [m.version for m in applied]
        print_json(out)
    else:
        print(f"PostgreSQL {server} at {redact_dsn(section.dsn)}")
        if applied is not None:
            print(f"applied {len(applied)} migration(s)"
                  + (": " + ", ".join(f"{m.version:04d}_{m.name}" for m in applied)
                     if applied else ""))
        for r in rows:
            print(f"  {r['version']:04d}  {r['state']:<8}  {r['name']:<28} "
                  f"{r['applied_at'] or ''}")
        print("schema up to date" if not bad else f"{len(bad)} migration(s) not applied")
    return 0 if not bad else 1
