"""The SQLite timeline's single writer thread: batching, chain assignment (``chain.py``),
group commit, checkpoints (while a database is still in WAL).

Used by :class:`runtime.timeline.store.SqliteTimelineStore`. Appends are queued from the
event loop (synchronously, so per-session order is call order) and drained by one thread:
everything that queued up meanwhile is one batch. That thread is the only place seq,
timestamp clamping, prev_hash and hash are assigned, which is what serialises appends to
a session without a lock per session (DESIGN.md "Performance": do blocking SQLite work off
the event loop, in batches).

A batch is acknowledged (every caller's future resolved on its own loop) once it is one
line of the pending log (``pending.py``); what is pending is committed to SQLite in ONE
transaction every ``FLUSH_INTERVAL`` s (300), at ``FLUSH_BYTES``, on :meth:`flush` (before an
in-process read) and on stop, then the log is emptied (issue 9 "Disk": a turn no longer
costs a transaction of ~8 pages). Flush commits run with ``synchronous=FULL``: journal
and database are fsynced before the log is emptied.

The database runs a rollback journal (``schema.JOURNAL_MODE``). One still in WAL (an
older version's, not yet converted: ``schema.set_journal_mode``) is checkpointed by a
second thread and connection once after every flush commit (PASSIVE): done inline
(``wal_autocheckpoint``) a checkpoint stalled the commit that triggered it by ~10 ms.
"""

from __future__ import annotations

import asyncio
import copy
import fcntl
import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import structlog

from runtime.timeline.chain import Request, Result, chain_batch
from runtime.timeline.commit import Head, in_transaction, load_head, replay_pending
from runtime.timeline.model import (
    TimelineBusyError,
    TimelineClosedError,
    TimelineError,
    TimelineEvent,
)
from runtime.timeline.pending import FLUSH_BYTES, FLUSH_INTERVAL, PendingLog

log = structlog.get_logger(__name__)

MAX_BATCH = 512  # appends per batch; bounds the latency one batch adds to the next
FLUSH_RETRY = 5.0  # seconds until a failed flush (disk full, busy) is tried again

_HEAD_FIELDS = tuple(f.name for f in fields(Head))


def writer_lock(db_path: str) -> int:
    """Take ``<db>.lock`` (an exclusive ``flock``, held until the fd is closed) for the one
    process that may write ``db_path`` and own its pending log: a second writer would
    replay and empty the log under the first, whose next commit then fails. Returns the
    fd. Raises TimelineBusyError when another process holds it, OSError otherwise."""
    fd = os.open(db_path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise TimelineBusyError(
            f"{db_path} is open for writing by another process (a running gateway); "
            "write through it, or stop it first") from None
    except OSError:
        os.close(fd)
        raise
    return fd


@dataclass(slots=True)
class _Flush:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


@dataclass(slots=True)
class Pause:
    """A parked writer thread (:meth:`TimelineWriter.pause`): ``parked`` resolves once the
    thread has written what was queued before it and waits, touching neither the pending
    log nor the database; :meth:`resume` lets it go on (also after ``max_s`` seconds, so
    a forgotten pause never stops the timeline for good)."""

    loop: asyncio.AbstractEventLoop
    parked: asyncio.Future
    max_s: float
    _go: threading.Event

    def resume(self) -> None:
        self._go.set()


_STOP = object()


class TimelineWriter:
    """Owns the write connection, the pending log, the writer and the checkpoint thread.

    ``connect()`` returns a new read-write connection (``schema.connect``); the
    schema must already exist. ``pending``: the pending log's path, replayed here (a crash
    left events in it). Start with :meth:`start`, stop with :meth:`stop` (blocking: writes
    and commits everything queued before it, then closes). Raises sqlite3.Error / OSError
    when the replay cannot write.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], name: str,
                 pending: str) -> None:
        self._connect = connect
        self._name = name
        self._conn = connect()
        self._conn.execute("PRAGMA synchronous=FULL")  # one fsync per flush, not per turn
        replay_pending(self._conn, pending)
        self._pending = PendingLog(pending)
        self._heads: dict[str, Head] = {}
        self._rows: list[tuple] = []  # acknowledged, not yet in SQLite
        self._dirty: dict[str, Head] = {}  # heads those rows lead to (pinned in _heads)
        self._ids: set[str] = set()  # their event ids
        self._due: float | None = None  # monotonic time of the next flush
        self.flush_error: str | None = None  # why the last commit failed (until one works)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._stopping = False
        self._checkpoint_wake = threading.Event()
        self._thread = threading.Thread(target=self._main, name="timeline-writer", daemon=True)
        self._checkpointer = threading.Thread(target=self._checkpoint_main,
                                              name="timeline-checkpoint", daemon=True)

    def start(self) -> None:
        """Start both threads."""
        self._thread.start()
        self._checkpointer.start()

    @property
    def unflushed(self) -> int:
        """Acknowledged events not yet committed to SQLite."""
        return len(self._rows)

    def problems(self) -> list[str]:
        """One line while commits to SQLite fail (they are retried; the events are safe in
        the pending log), for ``tidegate status`` and ``doctor``; else []."""
        if self.flush_error is None:
            return []
        return [(f"timeline: {self.unflushed} events not committed to {self._name} "
                 f"(commits failing: {self.flush_error}; they are kept in the pending log "
                 "and retried; a restart replays it)")]

    def submit(self, kind: str, session_id: str, event_id: str, event_type: str,
               timestamp: int, content_json: str, session_key: str = "") -> asyncio.Future:
        """Queue one create/append; the future resolves to the TimelineEvent once it is
        durable (in the pending log). Must be called on the event loop that awaits the
        future. Raises TimelineClosedError after :meth:`stop`.
        """
        if self._stopping:
            raise TimelineClosedError(f"timeline store {self._name} is closed")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put(Request(kind, session_id, event_id, event_type, timestamp,
                                content_json, session_key, loop, fut))
        return fut

    def submit_many(self, session_id: str, items: list[tuple[str, str, str, int, str]],
                    session_key: str = "") -> list[asyncio.Future]:
        """Queue several creates/appends of one session as one unit (``items``:
        ``(kind, event_id, event_type, timestamp_ms, content_json)``): they are written
        in the same batch (issue 9: one write per turn). One future per item.
        Raises TimelineClosedError after :meth:`stop`."""
        if self._stopping:
            raise TimelineClosedError(f"timeline store {self._name} is closed")
        loop = asyncio.get_running_loop()
        reqs = [Request(kind, session_id, eid, etype, ts, content, session_key, loop,
                        loop.create_future()) for kind, eid, etype, ts, content in items]
        self._queue.put(reqs)
        return [r.future for r in reqs]

    def flush(self) -> asyncio.Future:
        """Commit everything acknowledged so far to SQLite; the future resolves when done
        (or raises the sqlite3.Error that refused it). Raises TimelineClosedError after
        :meth:`stop`."""
        if self._stopping:
            raise TimelineClosedError(f"timeline store {self._name} is closed")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put(_Flush(loop, fut))
        return fut

    def pause(self, max_s: float = 10.0) -> Pause:
        """Park the writer thread between two batches (a backup's cut: the pending log and
        the database stay as they are until :meth:`Pause.resume`). Appends queued
        meanwhile wait, unacknowledged. Must be called on the event loop that awaits
        ``parked``. Raises TimelineClosedError after :meth:`stop`."""
        if self._stopping:
            raise TimelineClosedError(f"timeline store {self._name} is closed")
        loop = asyncio.get_running_loop()
        p = Pause(loop, loop.create_future(), max_s, threading.Event())
        self._queue.put(p)
        return p

    def stop(self) -> None:
        """Write and commit what is queued, then stop both threads and close."""
        if self._stopping:
            return
        self._stopping = True
        self._queue.put(_STOP)
        self._checkpoint_wake.set()
        self._thread.join()
        self._checkpointer.join()

    # ---- writer thread ------------------------------------------------------------------

    def _next(self) -> Any:
        """The next queue item; on the flush deadline, commit what is pending first."""
        while True:
            timeout = None if self._due is None else max(0.0, self._due - time.monotonic())
            try:
                return self._queue.get(timeout=timeout)
            except queue.Empty:
                self._commit_pending()

    def _main(self) -> None:
        q = self._queue
        stop = False
        while not stop:
            item = self._next()
            if item is _STOP:
                break
            batch: list[Request] = []
            flushes: list[_Flush] = []
            pause: Pause | None = None
            while True:  # a unit (list) is never split across batches
                if item is _STOP:
                    stop = True
                    break
                if isinstance(item, Pause):
                    pause = item  # what was queued before it is written first
                    break
                if isinstance(item, _Flush):
                    flushes.append(item)
                elif isinstance(item, list):
                    batch.extend(item)
                else:
                    batch.append(item)
                if len(batch) >= MAX_BATCH:
                    break
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._write_batch(batch)
            if flushes or self._pending.size >= FLUSH_BYTES:
                self._settle_flushes(flushes, self._commit_pending())
            if pause is not None:
                _park(pause)
        self._commit_pending()
        self._conn.close()
        self._pending.close()

    def _checkpoint_main(self) -> None:
        conn = self._connect()
        try:
            while not self._stopping:
                self._checkpoint_wake.wait()  # set by each flush commit and by stop
                self._checkpoint_wake.clear()
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:  # busy or I/O trouble: try again next round
                    log.warning("timeline_checkpoint_failed", error=str(exc))
        finally:
            conn.close()

    def _commit_pending(self) -> BaseException | None:
        """One transaction for everything acknowledged since the last one, then empty the
        pending log. Returns the error that refused it (kept pending, retried later)."""
        if not self._rows:
            self._due = None
            return None
        try:
            in_transaction(self._conn, self._rows, self._dirty)
        except sqlite3.Error as exc:
            log.error("timeline_flush_failed", path=self._name, events=len(self._rows),
                      error=str(exc), effect=f"kept in the pending log; retried in "
                      f"{FLUSH_RETRY:g} s")
            self._due = time.monotonic() + FLUSH_RETRY
            self.flush_error = str(exc)
            return exc
        self.flush_error = None
        try:
            self._pending.reset()
        except OSError as exc:  # the next open's replay skips what is committed
            log.warning("timeline_pending_reset_failed", error=str(exc))
        for sid, h in self._dirty.items():
            h.new = False
            if h.status == "archived":
                self._heads.pop(sid, None)
                log.info("timeline_archived", session_id=sid, events=h.last_seq)
        self._rows, self._dirty, self._due = [], {}, None
        self._ids.clear()
        self._checkpoint_wake.set()  # copy this commit's pages into the database now
        return None

    @staticmethod
    def _settle_flushes(flushes: list[_Flush], error: BaseException | None) -> None:
        for f in flushes:
            try:
                f.loop.call_soon_threadsafe(_settle, f.future, error)
            except RuntimeError:  # loop closed: the caller is gone
                pass

    def _write_batch(self, batch: list[Request]) -> None:
        saved = {r.session_id: copy.copy(self._heads.get(r.session_id)) for r in batch}
        try:
            results, rows, touched = chain_batch(batch, self._head, self._heads,
                                                 self._taken_ids(batch))
            if rows:
                self._pending.append(rows)
        except Exception as exc:  # noqa: BLE001 - disk full, a bug: fail the callers, not the thread
            self._restore(saved)
            log.error("timeline_write_failed", session_id=batch[0].session_id,
                      size=len(batch), error=str(exc), error_type=type(exc).__name__)
            err = TimelineError(f"timeline write failed: {exc}")
            results = [(req, None, err) for req in batch]
        else:
            self._rows.extend(rows)
            self._ids.update(r[0] for r in rows)
            self._dirty.update(touched)
            if rows and self._due is None:
                self._due = time.monotonic() + FLUSH_INTERVAL
        by_loop: dict[asyncio.AbstractEventLoop, list[Result]] = {}
        for res in results:
            by_loop.setdefault(res[0].loop, []).append(res)
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, items)
            except RuntimeError:  # loop closed: the caller is gone
                pass

    def _restore(self, saved: dict[str, Head | None]) -> None:
        """Undo a failed batch's head changes in place (dirty heads are the same objects)."""
        for sid, snap in saved.items():
            cur = self._heads.get(sid)
            if snap is None:
                self._heads.pop(sid, None)
            elif cur is None:
                self._heads[sid] = snap
            else:
                for name in _HEAD_FIELDS:
                    setattr(cur, name, getattr(snap, name))

    def _head(self, session_id: str) -> Head | None:
        head = self._heads.get(session_id)
        if head is None:
            head = load_head(self._conn, session_id)
            if head is not None and head.status == "active":
                self._heads[session_id] = head
        return head

    def _taken_ids(self, batch: list[Request]) -> set[str]:
        """The batch's event ids that are already used (pending or in the database)."""
        ids = [r.event_id for r in batch if isinstance(r.event_id, str)]
        taken = {i for i in ids if i in self._ids}
        for i in range(0, len(ids), 500):
            part = ids[i:i + 500]
            taken.update(r[0] for r in self._conn.execute(
                "SELECT event_id FROM timeline_events WHERE event_id IN"
                f" ({','.join('?' * len(part))})", part))
        return taken


def _park(pause: Pause) -> None:
    """On the writer thread: tell the pauser it is parked, then wait for its resume."""
    try:
        pause.loop.call_soon_threadsafe(_settle, pause.parked, None)
    except RuntimeError:  # loop closed: nobody waits for the pause
        return
    if not pause._go.wait(pause.max_s):
        log.warning("timeline_pause_expired", max_s=pause.max_s)


def _settle(fut: asyncio.Future, error: BaseException | None) -> None:
    if not fut.done():
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)


def _resolve(items: list[Result]) -> None:
    """Runs on the caller's loop: settle each future (skipping cancelled ones)."""
    for req, row, exc in items:
        fut = req.future
        if fut.done():  # caller cancelled; the event (if any) is written regardless
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(TimelineEvent(row[0], row[1], row[2], row[3], row[4],
                                         json.loads(row[5]), row[6], row[7]))
