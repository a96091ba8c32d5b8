"""``tidegate storage copy --from embedded --to postgres``: move a single host's state into
PostgreSQL (runtime/storage/copy.py does the copying and the proof).

Refused (exit 1) while a gateway runs on the state dir: the copy takes the gateway's own
state-dir lock and holds it throughout, so no gateway can start mid-copy either. Exit 2
without ``storage.dsn``; 1 when the target is not empty, unreachable or the verification
finds a difference; 0 when every count, chain, head, record and transcript tail matches.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from gateway.cli.output import print_json
from gateway.config.load import LoadedConfig


def cmd_copy(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.service.state_dir import GatewayLocked, lock_state_dir
    from runtime.storage.copy import CopyRefused
    from runtime.storage.postgres.errors import StorageStartError
    section = loaded.config.storage
    if not (section.dsn or "").strip():
        print("error: storage.dsn is not set: it names the PostgreSQL database to copy "
              "into (e.g. dsn: ${TIDEGATE_PG_DSN})", file=sys.stderr)
        return 2
    try:
        fd = lock_state_dir(loaded.state_dir)
    except GatewayLocked as exc:
        print(f"error: refused: {exc}", file=sys.stderr)
        return 1
    try:
        report = asyncio.run(_copy(loaded))
    except (CopyRefused, StorageStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        os.close(fd)
    if args.json:
        print_json(report.to_dict())
    else:
        _print(report)
    return 0 if report.ok else 1


async def _copy(loaded: LoadedConfig) -> Any:
    from runtime.storage import copy
    from runtime.storage.postgres.pool import open_database
    cfg = loaded.config
    timeline = (Path(cfg.timeline.path).expanduser() if cfg.timeline.path
                else loaded.state_dir / "timeline.db")
    agents = sorted(set(cfg.agent_ids()) | {p.name for p in (
        loaded.state_dir / "agents").glob("*") if p.is_dir()})
    src = await asyncio.to_thread(copy.read_source, loaded.state_dir, timeline, agents)
    pool = await open_database(cfg.storage.model_copy(update={
        "pool": cfg.storage.pool.model_copy(update={"min": 1, "max": 2})}))
    try:
        await copy.write_target(pool, src)
        return await copy.verify_target(pool, src, loaded.state_dir)
    finally:
        await pool.close()


def _print(report: Any) -> None:
    sessions = ", ".join(f"{a}: {n}" for a, n in sorted(report.sessions.items())) or "none"
    print(f"copied {report.timelines} timelines ({report.events} events), sessions "
          f"({sessions}), {report.transcripts} transcripts ({report.transcript_lines} "
          f"lines); {report.transcripts_checked} session transcript tails checked")
    print("stores: " + ", ".join(f"{k} {v}" for k, v in report.stores.items()))
    if report.ok:
        print("verified: counts, every timeline chain and head, every session record and "
              "transcript tail match")
        return
    print(f"VERIFICATION FAILED ({len(report.problems)} problems):")
    for line in report.problems:
        print(f"  {line}")
