"""``storage copy`` for the smaller stores (issue 15 "Migration"): cron jobs and run logs,
the outbox (pending and dead letters), inbound dedupe keys, pairing, the heartbeat
delivery ledger, auth profile state, Discord catch-up cursors, the usage ledger and the
exec approvals' "always allow" patterns — read from the embedded files,
written into the (empty, migrated) PostgreSQL tables in the copy's transaction, then
verified: per store the row count and every key equal to the source's.

Each store is a :class:`Part` (read the source, the target's rows, insert); adding a
store means adding one part.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from runtime.clock import parse_iso
from runtime.storage.dedupe import DEFAULT_TTL
from runtime.storage.embedded.cron_files import CronFiles
from runtime.storage.embedded.dedupe_file import DedupeFile
from runtime.storage.embedded.outbox_files import OutboxFiles

Rows = dict[str, Any]  # key -> value to compare after the copy


@dataclass(frozen=True)
class Part:
    name: str
    tables: tuple[str, ...]
    read: Callable[[Path], Rows]  # the source, from the state dir (blocking)
    insert: Callable[[asyncpg.Connection, Rows], Awaitable[None]]
    stored: Callable[[asyncpg.Connection], Awaitable[Rows]]  # the target, for verify


def _stamp(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return parse_iso(value) if value else 0.0
    except (TypeError, ValueError):
        return 0.0


def _read_cron(state: Path) -> Rows:
    raw, _ = CronFiles(state / "cron" / "jobs.json").read()
    return {str(j["id"]): j for j in raw if isinstance(j, dict) and "id" in j}


async def _insert_cron(conn: asyncpg.Connection, rows: Rows) -> None:
    await conn.executemany(
        "INSERT INTO cron_jobs (job_id, job, defined_at) VALUES ($1, $2, $3)",
        [(k, json.dumps(v, ensure_ascii=False), _stamp(v.get("updated_at")))
         for k, v in rows.items()])


async def _stored_cron(conn: asyncpg.Connection) -> Rows:
    return {r[0]: json.loads(r[1]) for r in await conn.fetch(
        "SELECT job_id, job FROM cron_jobs WHERE NOT removed")}


def _read_runs(state: Path) -> Rows:
    files = CronFiles(state / "cron" / "jobs.json")
    if not files.runs_dir.is_dir():
        return {}
    return {f"{p.stem}#{i}": rec for p in sorted(files.runs_dir.glob("*.jsonl"))
            for i, rec in enumerate(files.read_runs(p.stem, 10**9))}


async def _insert_runs(conn: asyncpg.Connection, rows: Rows) -> None:
    await conn.executemany("INSERT INTO cron_runs (job_id, record) VALUES ($1, $2)",
                           [(k.split("#")[0], json.dumps(v, ensure_ascii=False,
                                                         separators=(",", ":")))
                            for k, v in sorted(rows.items(), key=_run_order)])


def _run_order(item: tuple[str, Any]) -> tuple[str, int]:
    job, _, n = item[0].partition("#")
    return job, int(n)


async def _stored_runs(conn: asyncpg.Connection) -> Rows:
    out: Rows = {}
    counter: dict[str, int] = {}
    for job_id, text in await conn.fetch("SELECT job_id, record FROM cron_runs ORDER BY id"):
        n = counter.get(job_id, 0)
        counter[job_id] = n + 1
        out[f"{job_id}#{n}"] = json.loads(text)
    return out


def _read_outbox(state: Path) -> Rows:
    pending, dead, _bad = OutboxFiles(state / "outbox").read_all() \
        if (state / "outbox").is_dir() else ({}, {}, [])
    return {**{k: [v, False] for k, v in pending.items()},
            **{k: [v, True] for k, v in dead.items()}}


async def _insert_outbox(conn: asyncpg.Connection, rows: Rows) -> None:
    # owner "copied": no replica has that id, so the first replica to start adopts them
    await conn.executemany("INSERT INTO outbox (id, owner, entry, dead) VALUES "
                           "($1, 'copied', $2, $3)",
                           [(k, json.dumps(v[0], ensure_ascii=False), v[1])
                            for k, v in rows.items()])


async def _stored_outbox(conn: asyncpg.Connection) -> Rows:
    return {r[0]: [json.loads(r[1]), r[2]] for r in await conn.fetch(
        "SELECT id, entry, dead FROM outbox")}


def _read_dedupe(state: Path) -> Rows:
    path = state / "channels" / "inbound-seen.jsonl"
    return DedupeFile(path).load(time.time(), DEFAULT_TTL) if path.exists() else {}


async def _insert_dedupe(conn: asyncpg.Connection, rows: Rows) -> None:
    await conn.executemany("INSERT INTO inbound_seen (key, seen_at) VALUES ($1, $2)",
                           list(rows.items()))


async def _stored_dedupe(conn: asyncpg.Connection) -> Rows:
    return {r[0]: r[1] for r in await conn.fetch("SELECT key, seen_at FROM inbound_seen")}


DOCUMENTS = ("heartbeat/delivered.json", "auth-state.json")  # names = paths in the state dir


def _read_documents(state: Path) -> Rows:
    out = {name: (state / name).read_bytes() for name in DOCUMENTS
           if (state / name).is_file()}
    for path in sorted((state / "channels").glob("discord-*-cursors.json")):
        account = path.name.removeprefix("discord-").removesuffix("-cursors.json")
        out[f"discord/{account}/cursors.json"] = path.read_bytes()  # catch-up cursors
    for path in sorted((state / "channels").glob("email-*-checkpoint.json")):
        account = path.name.removeprefix("email-").removesuffix("-checkpoint.json")
        out[f"email/{account}/checkpoint.json"] = path.read_bytes()  # UID checkpoint
    for path in sorted((state / "channels").glob("matrix-*-sync.json")):
        account = path.name.removeprefix("matrix-").removesuffix("-sync.json")
        out[f"matrix/{account}/sync.json"] = path.read_bytes()  # the sync position
    return out


async def _insert_documents(conn: asyncpg.Connection, rows: Rows) -> None:
    await conn.executemany("INSERT INTO state_documents (name, body) VALUES ($1, $2)",
                           list(rows.items()))


async def _stored_documents(conn: asyncpg.Connection) -> Rows:
    return {r[0]: bytes(r[1]) for r in await conn.fetch(
        "SELECT name, body FROM state_documents")}


def _read_usage(state: Path) -> Rows:
    out: Rows = {}
    for path in sorted((state / "usage").glob("????-??.jsonl")):
        for raw in path.read_bytes().splitlines():
            try:
                out[str(len(out))] = [parse_iso(json.loads(raw)["ts"]), raw.decode()]
            except (ValueError, KeyError, TypeError):
                continue  # a torn line: readers skip it too
    return out


async def _insert_usage(conn: asyncpg.Connection, rows: Rows) -> None:
    await conn.executemany("INSERT INTO usage_records (ts, record) VALUES ($1, $2)",
                           [tuple(v) for _, v in sorted(rows.items(),
                                                        key=lambda kv: int(kv[0]))])


async def _stored_usage(conn: asyncpg.Connection) -> Rows:
    return {str(i): [r[0], r[1]] for i, r in enumerate(await conn.fetch(
        "SELECT ts, record FROM usage_records ORDER BY id"))}


def _read_pairing(state: Path) -> Rows:
    return {p.stem: p.read_bytes() for p in sorted((state / "pairing").glob("*.json"))}


async def _insert_pairing(conn: asyncpg.Connection, rows: Rows) -> None:
    await conn.executemany("INSERT INTO pairing (channel, body, rev) VALUES ($1, $2, 1)",
                           list(rows.items()))


async def _stored_pairing(conn: asyncpg.Connection) -> Rows:
    return {r[0]: bytes(r[1]) for r in await conn.fetch(
        "SELECT channel, body FROM pairing WHERE body IS NOT NULL")}


def _read_patterns(state: Path) -> Rows:
    """The "always allow" patterns of ``approvals.json`` (pending and decided requests
    are not copied: a request belongs to the turn of the gateway that asked)."""
    path = state / "approvals.json"
    if not path.exists():
        return {}
    always = json.loads(path.read_text("utf-8"))["always"]
    return {f"{agent}\0{p['pattern']}": [str(p.get("by") or ""), float(p.get("at") or 0)]
            for agent, pats in always.items() for p in pats}


async def _insert_patterns(conn: asyncpg.Connection, rows: Rows) -> None:
    await conn.executemany(
        "INSERT INTO approval_patterns (agent_id, pattern, decided_by, at) VALUES "
        "($1, $2, $3, $4)", [(*k.split("\0", 1), by, at) for k, (by, at) in rows.items()])


async def _stored_patterns(conn: asyncpg.Connection) -> Rows:
    return {f"{r[0]}\0{r[1]}": [r[2], r[3]] for r in await conn.fetch(
        "SELECT agent_id, pattern, decided_by, at FROM approval_patterns")}


PARTS: list[Part] = [
    Part("pairing", ("pairing",), _read_pairing, _insert_pairing, _stored_pairing),
    Part("state documents", ("state_documents",), _read_documents, _insert_documents,
         _stored_documents),
    Part("usage ledger", ("usage_records",), _read_usage, _insert_usage, _stored_usage),
    Part("cron jobs", ("cron_jobs",), _read_cron, _insert_cron, _stored_cron),
    Part("cron runs", ("cron_runs",), _read_runs, _insert_runs, _stored_runs),
    Part("outbox", ("outbox",), _read_outbox, _insert_outbox, _stored_outbox),
    Part("inbound dedupe", ("inbound_seen",), _read_dedupe, _insert_dedupe, _stored_dedupe),
    Part("exec approval patterns", ("approval_patterns",), _read_patterns, _insert_patterns,
         _stored_patterns),
]


def read(state: Path) -> dict[str, Rows]:
    """Every part's source rows (blocking). Raises what a corrupt source raises."""
    return {p.name: p.read(state) for p in PARTS}


def tables() -> list[str]:
    """The target tables that must be empty before a copy."""
    return [t for p in PARTS for t in p.tables]


async def write(conn: asyncpg.Connection, src: dict[str, Rows]) -> None:
    """Insert every part (inside the caller's transaction)."""
    for p in PARTS:
        if src.get(p.name):
            await p.insert(conn, src[p.name])


async def verify(conn: asyncpg.Connection, src: dict[str, Rows]
                 ) -> tuple[dict[str, int], list[str]]:
    """(rows per part in the target, problems): counts and every row compared."""
    counts: dict[str, int] = {}
    problems: list[str] = []
    for p in PARTS:
        stored = await p.stored(conn)
        counts[p.name] = len(stored)
        want = src.get(p.name, {})
        if len(stored) != len(want):
            problems.append(f"{p.name}: {len(stored)} rows copied, source has {len(want)}")
        differ = [k for k, v in want.items() if stored.get(k) != v]
        if differ:
            problems.append(f"{p.name}: {len(differ)} rows differ after the copy "
                            f"(first: {differ[0]})")
    return counts, problems
