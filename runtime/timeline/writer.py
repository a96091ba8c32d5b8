"""The SQLite timeline's single writer thread: batching, chain assignment, checkpoints.

Used by :class:`runtime.timeline.store.SqliteTimelineStore`. Appends are queued from the
event loop (synchronously, so per-session order is call order) and drained by one thread:
everything that queued up while the previous transaction ran is committed as one
transaction, then every caller's future is resolved on its own loop. That thread is also
the only place seq, timestamp clamping, prev_hash and hash are assigned, which is what
serialises appends to a session without a lock per session (DESIGN.md "Performance": do
blocking SQLite work off the event loop, in batches).

WAL checkpoints run on a second thread and connection: done inline (``wal_autocheckpoint``)
a checkpoint stalled the commit that triggered it by ~10 ms, the whole p99 budget.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from runtime.timeline.model import (
    GENESIS_HASH,
    TimelineArchivedError,
    TimelineClosedError,
    TimelineError,
    TimelineEvent,
    TimelineExistsError,
    TimelineNotFoundError,
    event_hash_raw,
)

log = structlog.get_logger(__name__)

MAX_BATCH = 512  # appends per transaction; bounds the latency one batch adds to the next
CHECKPOINT_EVERY = 5000  # appends written before the checkpointer is woken early
# Seconds (real time: file housekeeping, not agent behaviour). Rare checkpoints copy each
# hot page once instead of once per turn and fsync seldom; the price is a longer WAL to
# replay after a crash and, on power loss, what the kernel had not yet written back.
CHECKPOINT_INTERVAL = 60.0

_Result = tuple["_Request", Any, "BaseException | None"]


@dataclass(slots=True)
class _Head:
    """Writer-side cache of a session's chain head."""

    last_seq: int
    last_hash: str
    last_ts: int
    status: str
    new: bool = False  # created in the current batch (timelines row not yet inserted)
    session_key: str = ""
    created_at: int = 0
    ended_at: int | None = None


@dataclass(slots=True)
class _Request:
    kind: str  # "create" | "append"
    session_id: str
    event_id: str
    event_type: str
    timestamp: int
    content_json: str
    session_key: str
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


_STOP = object()


class TimelineWriter:
    """Owns the write connection, the writer thread and the checkpoint thread.

    ``connect()`` returns a new read-write connection (WAL, autocheckpoint off); the
    schema must already exist. Start with :meth:`start`, stop with :meth:`stop` (blocking:
    writes everything queued before it, then closes).
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], name: str) -> None:
        self._connect = connect
        self._name = name
        self._conn = connect()
        self._heads: dict[str, _Head] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._stopping = False
        self._since_checkpoint = 0
        self._checkpoint_wake = threading.Event()
        self._thread = threading.Thread(target=self._main, name="timeline-writer", daemon=True)
        self._checkpointer = threading.Thread(target=self._checkpoint_main,
                                              name="timeline-checkpoint", daemon=True)

    def start(self) -> None:
        """Start both threads."""
        self._thread.start()
        self._checkpointer.start()

    def submit(self, kind: str, session_id: str, event_id: str, event_type: str,
               timestamp: int, content_json: str, session_key: str = "") -> asyncio.Future:
        """Queue one create/append; the future resolves to the committed TimelineEvent.

        Must be called on the event loop that awaits the future. Raises TimelineClosedError
        after :meth:`stop`.
        """
        if self._stopping:
            raise TimelineClosedError(f"timeline store {self._name} is closed")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put(_Request(kind, session_id, event_id, event_type, timestamp,
                                 content_json, session_key, loop, fut))
        return fut

    def submit_many(self, session_id: str, items: list[tuple[str, str, str, int, str]],
                    session_key: str = "") -> list[asyncio.Future]:
        """Queue several creates/appends of one session as one unit (``items``:
        ``(kind, event_id, event_type, timestamp_ms, content_json)``): they are committed
        in the same transaction (issue 9: one transaction per turn). One future per item.
        Raises TimelineClosedError after :meth:`stop`."""
        if self._stopping:
            raise TimelineClosedError(f"timeline store {self._name} is closed")
        loop = asyncio.get_running_loop()
        reqs = [_Request(kind, session_id, eid, etype, ts, content, session_key, loop,
                         loop.create_future()) for kind, eid, etype, ts, content in items]
        self._queue.put(reqs)
        return [r.future for r in reqs]

    def stop(self) -> None:
        """Write what is queued, then stop both threads and close their connections."""
        if self._stopping:
            return
        self._stopping = True
        self._queue.put(_STOP)
        self._checkpoint_wake.set()
        self._thread.join()
        self._checkpointer.join()

    # ---- writer thread ------------------------------------------------------------------

    def _main(self) -> None:
        q = self._queue
        stop = False
        while not stop:
            item = q.get()
            if item is _STOP:
                break
            batch = list(item) if isinstance(item, list) else [item]
            while len(batch) < MAX_BATCH:  # a unit (list) is never split across batches
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                if isinstance(nxt, list):
                    batch.extend(nxt)
                else:
                    batch.append(nxt)
            self._write_batch(batch)
            self._since_checkpoint += len(batch)
            if self._since_checkpoint >= CHECKPOINT_EVERY:
                self._since_checkpoint = 0
                self._checkpoint_wake.set()
        self._conn.close()

    def _checkpoint_main(self) -> None:
        conn = self._connect()
        try:
            while not self._stopping:
                self._checkpoint_wake.wait(CHECKPOINT_INTERVAL)
                self._checkpoint_wake.clear()
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:  # busy or I/O trouble: try again next round
                    log.warning("timeline_checkpoint_failed", error=str(exc))
        finally:
            conn.close()

    def _write_batch(self, batch: list[_Request]) -> None:
        try:
            results = self._commit(batch)
        except sqlite3.Error as exc:
            # Something below the chain logic failed (disk full, another process wrote the
            # same session...). Forget cached heads and retry one by one so only the
            # request that really fails gets the error.
            self._heads.clear()
            if len(batch) > 1:
                log.warning("timeline_batch_retry", size=len(batch), error=str(exc))
                for req in batch:
                    self._write_batch([req])
                return
            log.error("timeline_write_failed", session_id=batch[0].session_id, error=str(exc))
            results = [(batch[0], None, TimelineError(f"timeline write failed: {exc}"))]
        except Exception as exc:  # a bug must fail the callers, not kill the writer thread
            self._heads.clear()
            log.exception("timeline_writer_error", size=len(batch))
            err = TimelineError(f"timeline writer error: {exc!r}")
            results = [(req, None, err) for req in batch]
        by_loop: dict[asyncio.AbstractEventLoop, list[_Result]] = {}
        for res in results:
            by_loop.setdefault(res[0].loop, []).append(res)
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, items)
            except RuntimeError:  # loop closed: the caller is gone
                pass

    def _head(self, session_id: str) -> _Head | None:
        head = self._heads.get(session_id)
        if head is None:
            row = self._conn.execute(
                "SELECT last_seq, last_hash, last_timestamp, status FROM timelines"
                " WHERE session_id = ?", (session_id,)).fetchone()
            if row is None:
                return None
            head = _Head(row[0], row[1], row[2], row[3])
            if head.status == "active":
                self._heads[session_id] = head
        return head

    def _commit(self, batch: list[_Request]) -> list[_Result]:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            results: list[_Result] = []
            rows: list[tuple] = []
            touched: dict[str, _Head] = {}
            for req in batch:
                sid = req.session_id
                head = self._head(sid)
                if req.kind == "create":
                    if head is not None:
                        results.append((req, None, TimelineExistsError(sid)))
                        continue
                    head = _Head(0, GENESIS_HASH, req.timestamp, "active", True,
                                 req.session_key, req.timestamp)
                    self._heads[sid] = head
                elif head is None:
                    results.append((req, None, TimelineNotFoundError(sid)))
                    continue
                elif head.status != "active":
                    results.append((req, None, TimelineArchivedError(sid)))
                    continue
                seq = head.last_seq + 1
                # Never decreasing: a wall clock stepped back reuses the last timestamp.
                ts = max(head.last_ts, req.timestamp)
                h = event_hash_raw(req.event_id, sid, seq, ts, req.event_type,
                                   req.content_json, head.last_hash)
                ev = (req.event_id, sid, seq, ts, req.event_type, req.content_json,
                      head.last_hash, h)
                rows.append(ev)
                head.last_seq, head.last_hash, head.last_ts = seq, h, ts
                if req.event_type == "SESSION_END":
                    head.status, head.ended_at = "archived", ts
                touched[sid] = head
                results.append((req, ev, None))
            self._store(conn, rows, touched)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        for sid, h in touched.items():
            h.new = False
            if h.status == "archived":
                self._heads.pop(sid, None)
                log.info("timeline_archived", session_id=sid, events=h.last_seq)
        return results

    @staticmethod
    def _store(conn: sqlite3.Connection, rows: list[tuple], touched: dict[str, _Head]) -> None:
        # Few statements per batch, each covering many rows: every sqlite3 call drops and
        # retakes the GIL, and retaking it while the event loop is busy can cost a whole
        # switch interval (5 ms), so per-row executemany would dominate the latency.
        new = [(sid, h.session_key, h.created_at, h.last_seq, h.last_hash, h.last_ts)
               for sid, h in touched.items() if h.new]
        old = [(sid, h.last_seq, h.last_hash, h.last_ts)
               for sid, h in touched.items() if not h.new]
        # The timelines row must exist and be active before its events (insert trigger).
        _many(conn, "INSERT INTO timelines (session_id, session_key, status, created_at,"
              " ended_at, last_seq, last_hash, last_timestamp) VALUES ",
              "(?, ?, 'active', ?, NULL, ?, ?, ?)", new)
        _many(conn, "UPDATE timelines SET last_seq = v.column2, last_hash = v.column3,"
              " last_timestamp = v.column4 FROM (VALUES ",
              "(?, ?, ?, ?)", old, ") AS v WHERE timelines.session_id = v.column1")
        _many(conn, "INSERT INTO timeline_events (event_id, session_id, seq, timestamp,"
              " event_type, content, prev_hash, hash) VALUES ",
              "(?, ?, ?, ?, ?, ?, ?, ?)", rows)
        ended = [(h.ended_at, sid) for sid, h in touched.items() if h.status == "archived"]
        if ended:  # after the events: SESSION_END itself needs the row still active
            conn.executemany("UPDATE timelines SET status = 'archived', ended_at = ?"
                             " WHERE session_id = ?", ended)


def _many(conn: sqlite3.Connection, head: str, row_sql: str, rows: list[tuple],
          tail: str = "", chunk: int = 400) -> None:
    """Run ``head + row_sql, row_sql, ... + tail`` over ``rows`` in chunks (<= 3,200 params)."""
    for i in range(0, len(rows), chunk):
        part = rows[i:i + chunk]
        conn.execute(head + ",".join([row_sql] * len(part)) + tail,
                     [v for row in part for v in row])


def _resolve(items: list[_Result]) -> None:
    """Runs on the caller's loop: settle each future (skipping cancelled ones)."""
    for req, row, exc in items:
        fut = req.future
        if fut.done():  # caller cancelled; the event (if any) is committed regardless
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(TimelineEvent(row[0], row[1], row[2], row[3], row[4],
                                         json.loads(row[5]), row[6], row[7]))
