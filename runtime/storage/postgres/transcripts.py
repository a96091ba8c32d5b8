"""The PostgreSQL :class:`runtime.storage.transcripts.TranscriptStore`: table
``transcript_lines`` (``migrations/0003_transcripts.sql``), partitioned per agent, one row
per JSONL line holding exactly the bytes the embedded backend writes (``seq`` 0 is the
header). Rows are never updated or deleted (triggers), so ``export`` rebuilds the file a
single host keeps byte for byte.

Writes: the writer assigns ``seq`` and ``parentId`` itself (recovered from the last row
when it opens) and hands each durability point's lines to one background writer on the
gateway's loop (transcript_batch.py): everything queued meanwhile, of every session, in
ONE multi-row INSERT, a session's flushes committed strictly in order, an outage ridden
out (runtime/storage/postgres/retry.py). ``settled(session_id)``
awaits them; the gateway waits for it before it delivers a reply, as for the timeline.
The primary key (agent, session, seq) is the guard against a second writer: if another
replica appended to the session meanwhile (its lane moved), the insert fails, nothing is
written, ``transcript_write_conflict`` is logged and the writer is marked stale so the
session is reloaded from the table.

Reads (context tail, history, export) are blocking, through the gateway's
:class:`SyncBridge`, paged newest first so their cost is what they read; off the event
loop a read waits out an outage like a write (up to 20 s), on it it fails at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg
import structlog

from runtime import transcript as _transcript
from runtime.clock import SYSTEM_CLOCK, Clock, utc_iso
from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.retry import RetryStats, ride_out_blocking
from runtime.storage.postgres.transcript_batch import LineBatcher
from runtime.transcript import TRANSCRIPT_VERSION, TailResult

log = structlog.get_logger(__name__)

PAGE = 256  # rows per page of a backwards read
_INSERT = ("INSERT INTO transcript_lines (agent_id, session_id, seq, entry_id, line) "
           "SELECT $1, $2, * FROM unnest($3::bigint[], $4::text[], $5::text[])")


def _line(obj: dict[str, Any]) -> str:
    """The entry as the file holds it (runtime.transcript._dumps without the newline)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _parse(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    try:
        obj = json.loads(raw)
        if not isinstance(obj, dict) or "type" not in obj:
            raise ValueError("not an entry object")
    except ValueError as exc:
        return None, f"invalid line: {exc}"
    return obj, None


class PgTranscripts:
    """Transcripts in PostgreSQL. ``pool`` (the gateway's asyncpg pool, on its loop) takes
    the writes; ``bridge`` serves the blocking reads. ``clock`` paces outage retries."""

    backend = "postgres"

    def __init__(self, bridge: SyncBridge, pool: asyncpg.Pool | None = None, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.bridge = bridge
        self.pool = pool
        self.clock = clock
        self.stats = RetryStats()
        self._agents: set[str] = set()
        self._batcher: LineBatcher | None = None
        self.fence: Any = None  # session key -> lane fence (replicas: fence.py)

    def location(self, agent_id: str, session_id: str) -> str:
        return f"postgresql:transcript_lines/{agent_id}/{session_id}"

    def ensure_agent(self, agent_id: str) -> None:
        """Create the agent's partition unless it exists (blocking, once per process)."""
        if agent_id not in self._agents:
            self.bridge.call(lambda c: c.fetchval("SELECT transcript_partition($1)",
                                                  agent_id))
            self._agents.add(agent_id)

    def writer(self, agent_id: str, session_id: str, session_key: str, *, clock: Clock,
               cwd: str | None = None) -> PgTranscriptWriter:
        return PgTranscriptWriter(self, agent_id, session_id, session_key, clock, cwd)

    def _page(self, agent_id: str, session_id: str, below: int | None,
              limit: int) -> list[tuple[int, str]]:
        async def fetch(conn: asyncpg.Connection) -> list[Any]:
            return await conn.fetch(
                "SELECT seq, line FROM transcript_lines WHERE agent_id = $1 AND "
                "session_id = $2 AND ($3::bigint IS NULL OR seq < $3) ORDER BY seq DESC "
                "LIMIT $4", agent_id, session_id, below, limit)
        # a reader off the loop (a turn's preload, a resumed turn's look-up) waits out an
        # outage as the turn's writes do, instead of failing the turn at once
        rows = ride_out_blocking(lambda: self.bridge.call(fetch), what="transcript",
                                 stats=self.stats, reading=session_id)
        return [(r[0], r[1]) for r in rows]

    def rows_reversed(self, agent_id: str, session_id: str) -> Iterator[tuple[int, str]]:
        """``(seq, line)`` newest first, one page at a time."""
        below: int | None = None
        while True:
            rows = self._page(agent_id, session_id, below, PAGE)
            yield from rows
            if len(rows) < PAGE:
                return
            below = rows[-1][0]

    def entries_reversed(self, agent_id: str, session_id: str
                         ) -> Iterator[tuple[dict[str, Any] | None, str | None]]:
        for _seq, raw in self.rows_reversed(agent_id, session_id):
            obj, problem = _parse(raw)
            if obj is None or obj.get("type") != "session":
                yield obj, problem

    def tail(self, agent_id: str, session_id: str, max_bytes: int) -> TailResult:
        result = TailResult()
        size = 0
        result.complete = True
        for seq, raw in self.rows_reversed(agent_id, session_id):
            size += len(raw.encode()) + 1
            if size > max_bytes and seq > 0:
                result.complete = False
                break
            obj, problem = _parse(raw)
            if obj is None:
                result.skipped.append((seq, problem or "invalid line"))
            elif obj.get("type") == "session":
                result.header = obj
            else:
                result.entries.append(obj)
        result.entries.reverse()
        return result

    def header(self, agent_id: str, session_id: str) -> dict[str, Any] | None:
        rows = self.bridge.call(lambda c: c.fetch(
            "SELECT line FROM transcript_lines WHERE agent_id = $1 AND session_id = $2 "
            "AND seq = 0", agent_id, session_id))
        return _parse(rows[0][0])[0] if rows else None

    def export(self, agent_id: str, session_id: str) -> bytes | None:
        rows = self.bridge.call(lambda c: c.fetch(
            "SELECT line FROM transcript_lines WHERE agent_id = $1 AND session_id = $2 "
            "ORDER BY seq", agent_id, session_id))
        if not rows:
            return None
        return "".join(r[0] + "\n" for r in rows).encode("utf-8")

    def write_new(self, agent_id: str, session_id: str, lines: list[str]) -> None:
        """A whole transcript (header first) as new rows, in one transaction (blocking:
        ``timeline rebuild-transcript``, ``storage copy``). Raises FileExistsError when
        the session has rows already."""
        ids = [str(o.get("id")) if (o := _parse(raw)[0]) and o.get("type") != "session"
               and o.get("id") else None for raw in lines]

        async def run(conn: asyncpg.Connection) -> None:
            async with conn.transaction():
                await conn.fetchval("SELECT transcript_partition($1)", agent_id)
                await conn.execute(_INSERT, agent_id, session_id, list(range(len(lines))),
                                   ids, lines)
        try:
            self.bridge.call(run)
        except asyncpg.UniqueViolationError:
            raise FileExistsError(self.location(agent_id, session_id)) from None
        self._agents.add(agent_id)

    # -- writes (on the gateway's loop) ---------------------------------------------------
    def submit(self, w: PgTranscriptWriter, rows: list[tuple[int, str | None, str]]) -> None:
        """Queue ``rows`` (seq, entry id, line) of one flush after the session's previous
        flush; committed in the background (transcript_batch.py)."""
        if self._batcher is None:
            assert self.pool is not None, "PgTranscripts needs the gateway's pool to write"
            self._batcher = LineBatcher(self.pool, self.clock, self.stats)
        self._batcher.submit(w, rows, self.fence(w.session_key) if self.fence else None)

    @property
    def conflicts(self) -> int:
        return self._batcher.conflicts if self._batcher else 0

    @property
    def failures(self) -> int:
        return self._batcher.failures if self._batcher else 0

    async def settled(self, session_id: str) -> None:
        if self._batcher is not None:
            await self._batcher.settled(session_id)

    async def flush(self) -> None:
        """Wait for every queued write (shutdown)."""
        if self._batcher is not None:
            await self._batcher.flush()

    def close(self) -> None:
        """The bridge and the pool are the gateway's; they are closed with it."""


class PgTranscriptWriter:
    """One session's :class:`runtime.storage.transcripts.TranscriptSink` on PostgreSQL:
    the same entries (ids, parentIds, timestamps, bytes) as
    :class:`runtime.transcript.TranscriptWriter`; ``flush`` queues one INSERT."""

    def __init__(self, store: PgTranscripts, agent_id: str, session_id: str,
                 session_key: str, clock: Clock, cwd: str | None) -> None:
        self.store, self.agent_id = store, agent_id
        self.session_id, self.session_key = session_id, session_key
        self.clock, self.cwd = clock, cwd
        self.path = store.location(agent_id, session_id)
        self.last_id: str | None = None
        self.stale = False  # a write failed or conflicted: reload before writing again
        self._next: int | None = None  # seq of the next line (None: not opened)
        self._holding = False  # between hold() and flush(end=True): one INSERT per flush
        self._pending: list[tuple[int, str | None, str]] = []

    def open(self) -> PgTranscriptWriter:
        if self._next is not None:
            return self
        self.store.ensure_agent(self.agent_id)
        last = self.store.bridge.call(lambda c: c.fetchrow(
            "SELECT seq, entry_id FROM transcript_lines WHERE agent_id = $1 AND "
            "session_id = $2 ORDER BY seq DESC LIMIT 1", self.agent_id, self.session_id))
        if last is None:
            header = {"type": "session", "version": TRANSCRIPT_VERSION, "id": self.session_id,
                      "timestamp": utc_iso(self.clock.time()), "session_key": self.session_key}
            if self.cwd:
                header["cwd"] = self.cwd
            self._next = 1
            self._pending.append((0, None, _line(header)))
        else:
            self._next = last[0] + 1
            self.last_id = last[1] or self._last_entry_id()
        return self

    def _last_entry_id(self) -> str | None:
        """The newest entry's id when the last row carries none (the header, or a line
        copied without it)."""
        for entry, _ in self.store.entries_reversed(self.agent_id, self.session_id):
            if entry is not None and entry.get("id"):
                return str(entry["id"])
        return None

    def append(self, entry_type: str, body: dict[str, Any], *,
               timestamp: float | None = None) -> dict[str, Any]:
        """Append one entry; returns it. Raises OSError when the writer is stale."""
        if self.stale:
            raise OSError(f"{self.path}: an earlier write failed; the session is reloaded "
                          "on its next turn")
        self.open()
        ts = self.clock.time() if timestamp is None else timestamp
        entry = {"type": entry_type, "id": _transcript.new_entry_id(), "parentId": self.last_id,
                 "timestamp": utc_iso(ts), **body}
        assert self._next is not None
        self._pending.append((self._next, entry["id"], _line(entry)))
        self._next += 1
        self.last_id = entry["id"]
        if not self._holding:
            self._submit()
        return entry

    def append_message(self, message: dict[str, Any]) -> dict[str, Any]:
        return self.append("message", {"message": message},
                           timestamp=message.get("timestamp", 0) / 1000.0 or None)

    def hold(self) -> None:
        self._holding = True

    def flush(self, *, end: bool = False) -> None:
        if end:
            self._holding = False
        self._submit()

    def _submit(self) -> None:
        if self._pending:
            rows, self._pending = self._pending, []
            self.store.submit(self, rows)

    async def settled(self) -> None:
        """Wait until the lines flushed so far are committed (or failed, logged)."""
        await self.store.settled(self.session_id)

    def close(self) -> None:
        self.flush(end=True)
