"""``tidegate storage copy --from embedded --to postgres`` (issue 15 "Migration"): copy a
single host's embedded state into an empty, migrated PostgreSQL database and prove the
copy.

What is copied, in ONE transaction (all or nothing): every timeline (head rows and
events, byte for byte: the hashes are not recomputed, they are checked), every agent's
session records, and every transcript file ``agents/<agent>/sessions/<session_id>.jsonl``
(current and earlier sessions), one ``transcript_lines`` row per line, the line's bytes
unchanged. Verification afterwards, against the target: row counts per table and agent,
every timeline chain re-verified in PostgreSQL (``verify``), every head (last seq and
hash) equal to the source's, every session record equal to the source's, and for every
transcript its line count and its tail (the last :data:`TAIL_LINES` lines, byte for
byte) equal to the file's, and every session record's transcript readable at its tail.
The smaller stores (cron jobs and runs, outbox, inbound dedupe, ...) are copied and
verified row by row in the same transaction (``copy_stores``).

The caller holds the state dir's gateway lock, so no gateway writes during the copy.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from runtime.storage import copy_stores
from runtime.storage.embedded.sessions_sqlite import SqliteSessionRecords
from runtime.storage.postgres.timeline import PgTimelineStore
from runtime.timeline.pending import merged_heads, merged_stream, pending_path, read_pending
from runtime.timeline.verify import EVENT_COLS, INFO_COLS

_PG_EVENT_COLS = [c.strip() for c in EVENT_COLS.split(",")]
TAIL_LINES = 50  # transcript lines compared byte for byte after the copy


class CopyRefused(Exception):
    """The copy cannot start (target not empty, source unreadable); nothing was written."""


@dataclass
class CopyReport:
    timelines: int = 0
    events: int = 0
    sessions: dict[str, int] = field(default_factory=dict)
    transcripts_checked: int = 0
    stores: dict[str, int] = field(default_factory=dict)  # rows per smaller store
    transcripts: int = 0
    transcript_lines: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "timelines": self.timelines, "events": self.events,
                "sessions": self.sessions, "transcripts_checked": self.transcripts_checked,
                "stores": self.stores,
                "transcripts": self.transcripts, "transcript_lines": self.transcript_lines,
                "problems": self.problems}


def _read_timeline(path: Path) -> tuple[list[tuple], list[tuple]]:
    """(timelines rows, events rows in (session_id, seq) order) of the SQLite timeline,
    from one read snapshot, with the acknowledged events still in its pending log."""
    if not path.is_file():
        return [], []
    pending = read_pending(pending_path(str(path)))  # before the database: misses nothing
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    try:
        conn.execute("BEGIN")
        heads = {r[0]: r for r in conn.execute(f"SELECT {INFO_COLS} FROM timelines")}
        events = list(merged_stream(conn.execute(
            f"SELECT {EVENT_COLS} FROM timeline_events ORDER BY session_id, seq"),
            pending, heads))
        conn.execute("COMMIT")
    finally:
        conn.close()
    return list(merged_heads(pending, heads).values()), events


def read_source(state_dir: Path, timeline_path: Path, agents: list[str]) -> dict[str, Any]:
    """Everything to copy, read from the embedded state (blocking). Raises CopyRefused."""
    try:
        heads, events = _read_timeline(timeline_path)
    except Exception as exc:  # noqa: BLE001 - any sqlite/OS error: say which file
        raise CopyRefused(f"cannot read the timeline {timeline_path}: {exc}") from None
    sessions: dict[str, dict[str, dict]] = {}
    for agent in agents:
        db = state_dir / "agents" / agent / "sessions" / "sessions.db"
        if not db.exists():
            continue
        records = SqliteSessionRecords(db, readonly=True)
        try:
            sessions[agent] = records.load_all()
        finally:
            records.close()
    try:
        stores = copy_stores.read(state_dir)
    except Exception as exc:  # noqa: BLE001 - a corrupt store file: say which
        raise CopyRefused(f"cannot read the embedded stores: {exc}") from None
    return {"heads": heads, "events": events, "sessions": sessions, "stores": stores,
            "transcripts": _read_transcripts(state_dir, agents)}


def _file_lines(path: Path) -> list[str]:
    """The file's lines without their newlines (a torn last line kept as it is; bytes
    that are not UTF-8 replaced: such a line was unreadable already)."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [raw.decode("utf-8", errors="replace") for raw in lines]


def _read_transcripts(state_dir: Path, agents: list[str]) -> dict[tuple[str, str], list[str]]:
    """``{(agent, session_id): lines}`` of every transcript file of ``agents``."""
    out: dict[tuple[str, str], list[str]] = {}
    for agent in agents:
        for path in sorted((state_dir / "agents" / agent / "sessions").glob("*.jsonl")):
            try:
                out[(agent, path.stem)] = _file_lines(path)
            except OSError as exc:
                raise CopyRefused(f"cannot read the transcript {path}: {exc}") from None
    return out


def _entry_id(line: str) -> str | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("type") == "session" or not obj.get("id"):
        return None
    return str(obj["id"])


async def _write_transcripts(conn: asyncpg.Connection,
                             transcripts: dict[tuple[str, str], list[str]]) -> None:
    for agent in sorted({a for a, _ in transcripts}):
        await conn.fetchval("SELECT transcript_partition($1)", agent)
    await conn.copy_records_to_table(
        "transcript_lines", columns=["agent_id", "session_id", "seq", "entry_id", "line"],
        records=[(agent, sid, seq, _entry_id(line), line)
                 for (agent, sid), lines in transcripts.items()
                 for seq, line in enumerate(lines)])


async def _refuse_unless_empty(conn: asyncpg.Connection) -> None:
    for table in ("timelines", "timeline_events", "sessions", "transcript_lines",
                  *copy_stores.tables()):
        if await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {table})"):
            raise CopyRefused(f"the target database already has rows in {table}; copy "
                              "only into an empty database (it never merges)")


async def write_target(pool: asyncpg.Pool, src: dict[str, Any]) -> None:
    """Insert the source into the (migrated, empty) database in one transaction.
    Raises CopyRefused when it is not empty."""
    async with pool.acquire() as conn, conn.transaction():
        await _refuse_unless_empty(conn)
        # Active first (the insert trigger refuses events of an archived timeline), with
        # the final head (it may not move backwards); archived after the events.
        await conn.copy_records_to_table(
            "timelines", columns=["session_id", "session_key", "status", "created_at",
                                  "ended_at", "last_seq", "last_hash", "last_timestamp"],
            records=[(h[0], h[1], "active", h[3], None, h[5], h[6], h[7])
                     for h in src["heads"]])
        await conn.copy_records_to_table("timeline_events", columns=_PG_EVENT_COLS,
                                         records=src["events"])
        archived = [(h[0], h[4]) for h in src["heads"] if h[2] == "archived"]
        if archived:
            await conn.executemany("UPDATE timelines SET status = 'archived', ended_at = $2 "
                                   "WHERE session_id = $1", archived)
        rows = [(agent, key, str(entry.get("session_id", "")),
                 json.dumps(entry, ensure_ascii=False, separators=(",", ":")))
                for agent, recs in src["sessions"].items() for key, entry in recs.items()]
        await conn.executemany("INSERT INTO sessions (agent_id, session_key, session_id, "
                               "entry) VALUES ($1, $2, $3, $4::jsonb)", rows)
        await copy_stores.write(conn, src.get("stores", {}))
        await _write_transcripts(conn, src["transcripts"])


def _tail_problem(lines: list[str], session_id: str) -> str | None:
    """Why a transcript's copied tail is not intact (no readable entry, wrong header),
    or None."""
    if not lines:
        return "no lines in PostgreSQL"
    try:
        first = json.loads(lines[0])
    except ValueError:
        first = None
    if isinstance(first, dict) and first.get("type") == "session" and \
            first.get("id") != session_id:
        return f"header id {first.get('id')!r} is not the session id"
    body = lines[1:] if isinstance(first, dict) and first.get("type") == "session" else lines
    if body and all(_entry_id(x) is None for x in body):
        return "no readable entry at its tail"
    return None


async def _verify_transcripts(conn: asyncpg.Connection, src: dict[str, Any],
                              report: CopyReport) -> dict[tuple[str, str], list[str]]:
    """Every copied transcript: line count and last TAIL_LINES lines equal to the file's.
    Returns the tails read from PostgreSQL."""
    counts = {(r[0], r[1]): r[2] for r in await conn.fetch(
        "SELECT agent_id, session_id, count(*) FROM transcript_lines GROUP BY 1, 2")}
    report.transcripts = len(counts)
    report.transcript_lines = sum(counts.values())
    tails: dict[tuple[str, str], list[str]] = {}
    for (agent, sid), lines in src["transcripts"].items():
        if counts.get((agent, sid), 0) != len(lines):
            report.problems.append(f"transcript {agent}/{sid}: {counts.get((agent, sid), 0)} "
                                   f"lines copied, the file has {len(lines)}")
        rows = await conn.fetch("SELECT line FROM transcript_lines WHERE agent_id = $1 AND "
                                "session_id = $2 ORDER BY seq DESC LIMIT $3", agent, sid,
                                TAIL_LINES)
        tails[(agent, sid)] = [r[0] for r in reversed(rows)]
        if tails[(agent, sid)] != lines[-TAIL_LINES:]:
            report.problems.append(f"transcript {agent}/{sid}: its tail differs after the "
                                   "copy")
    if len(counts) != len(src["transcripts"]):
        report.problems.append(f"{len(counts)} transcripts in PostgreSQL, the state dir has "
                               f"{len(src['transcripts'])}")
    return tails


async def verify_target(pool: asyncpg.Pool, src: dict[str, Any], state_dir: Path
                        ) -> CopyReport:
    """Compare the target with the source (counts, chains, heads, records, transcript
    tails); the report lists every problem found."""
    report = CopyReport()
    async with pool.acquire() as conn:
        report.timelines = await conn.fetchval("SELECT count(*) FROM timelines")
        report.events = await conn.fetchval("SELECT count(*) FROM timeline_events")
        pg_heads = {r[0]: tuple(r) for r in await conn.fetch(
            f"SELECT {INFO_COLS} FROM timelines")}
        stored = {(r[0], r[1]): json.loads(r[2]) for r in await conn.fetch(
            "SELECT agent_id, session_key, entry::text FROM sessions")}
        report.stores, problems = await copy_stores.verify(conn, src.get("stores", {}))
        report.problems.extend(problems)
        tails = await _verify_transcripts(conn, src, report)
    if report.timelines != len(src["heads"]) or report.events != len(src["events"]):
        report.problems.append(f"counts differ: {report.timelines} timelines / "
                               f"{report.events} events copied, source has "
                               f"{len(src['heads'])} / {len(src['events'])}")
    for head in src["heads"]:
        if pg_heads.get(head[0]) != tuple(head):
            report.problems.append(f"timeline {head[0]}: head differs after the copy")
    chain = await (await PgTimelineStore.open(pool, readonly=True)).verify()
    if not chain.ok:
        report.problems.append(f"timeline chain: {chain}")
    for agent, recs in src["sessions"].items():
        report.sessions[agent] = sum(1 for a, _ in stored if a == agent)
        if report.sessions[agent] != len(recs):
            report.problems.append(f"agent {agent}: {report.sessions[agent]} sessions "
                                   f"copied, source has {len(recs)}")
        for key, entry in recs.items():
            if stored.get((agent, key)) != entry:
                report.problems.append(f"session {key}: record differs after the copy")
            sid = str(entry.get("session_id", ""))
            if (agent, sid) in tails:
                report.transcripts_checked += 1
                problem = _tail_problem(tails[(agent, sid)], sid)
                if problem:
                    report.problems.append(f"session {key}: transcript: {problem}")
    return report
