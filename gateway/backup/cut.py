"""The cut of a backup the running gateway makes: every file that keeps changing taken at
ONE instant, so the archive is what a crash at that instant would have left (sessions.db,
the transcripts and the timeline agree).

While the cut is held (:func:`take_cut`, on the event loop, without awaiting):

- the **timeline writer thread** is parked between two batches (``TimelineWriter.pause``):
  neither its pending log nor its database moves;
- every agent's **session store** lock is held (``SqliteSessionRecords.lock``, taken by
  each write of ``sessions.db``);
- **transcript appends** run on the event loop thread (one ``write(2)`` per durability
  point, ``runtime/transcript.py``): the loop is busy with the cut, so none is made.

Meanwhile it opens a read transaction on every SQLite database of the backup (the
snapshot the online backup copies later), reads the timeline's pending log whole (a
commit empties it afterwards) and records the size of every append-only ``.jsonl`` file
(transcripts, usage, cron run logs, the intake journal, the gateway log), keeping a
descriptor open on the file where it may be replaced later (compaction, rotation). Then
it lets go; the copies are made afterwards, each append-only file cut to its recorded
size (and to its last whole line). The session locks are taken first (waiting for a
session write in flight delays no turn), then the timeline writer is parked: ``hold_ms``
(logged as ``backup_cut``, kept in the manifest) is how long it stayed parked, which is
what a turn can wait for (its end waits for its timeline events); ``pin_ms`` is the part
the event loop was busy with the cut.
Files that are replaced whole (cron jobs, pairing, the workspace) are read as they are
after the cut, as before.
"""

from __future__ import annotations

import asyncio
import os
import resource
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gateway.backup.snapshot import Item, backup_sqlite, read_item, write_target

log = structlog.get_logger(__name__)
LOCK_WAIT_S = 10.0  # a session write or timeline batch in flight takes milliseconds
FD_RESERVE = 256  # descriptors left to the gateway while a backup keeps files open
FD_CAP = 1024


@dataclass(slots=True)
class Sized:
    """An append-only file at the cut: its ``size`` then, an open ``fd`` (or None: the
    file is reopened by path and must still be the same inode ``ino``)."""

    size: int
    ino: int
    fd: int | None


@dataclass
class Cut:
    """What :func:`take_cut` pinned; :meth:`read` copies one item as of the cut."""

    sqlite: dict[str, sqlite3.Connection] = field(default_factory=dict)
    data: dict[str, bytes] = field(default_factory=dict)
    sized: dict[str, Sized] = field(default_factory=dict)
    extra: list[Item] = field(default_factory=list)  # .jsonl files newer than the plan
    at: float = 0.0
    hold_ms: float = 0.0

    def read(self, item: Item, dest: Path) -> bool:
        """Copy ``item`` to ``dest`` as it was at the cut (see ``snapshot.read_item``
        for the return value and errors)."""
        conn = self.sqlite.pop(item.rel, None)
        if conn is not None:
            try:
                backup_sqlite(conn, dest)
            finally:
                conn.close()
            return True
        if item.rel in self.data:
            write_target(dest, self.data.pop(item.rel))
            return True
        sized = self.sized.pop(item.rel, None)
        if sized is None:
            return read_item(item, dest)
        data = _read_sized(item.path, sized)
        if data is None:
            return False
        write_target(dest, data[: data.rfind(b"\n") + 1])  # whole lines only
        return True

    def manifest(self) -> dict[str, Any]:
        return {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)),
                "hold_ms": round(self.hold_ms, 3)}

    def close(self) -> None:
        for conn in self.sqlite.values():
            conn.close()
        for s in self.sized.values():
            if s.fd is not None:
                os.close(s.fd)
        self.sqlite.clear()
        self.sized.clear()


def _read_sized(path: Path, sized: Sized) -> bytes | None:
    """The first ``sized.size`` bytes of the file (None: it is gone or was replaced by
    another file since the cut). Raises OSError."""
    fd = sized.fd
    if fd is None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        if os.fstat(fd).st_ino != sized.ino:
            os.close(fd)
            return None
    try:
        chunks, pos = [], 0
        while pos < sized.size:
            chunk = os.pread(fd, min(1 << 20, sized.size - pos), pos)
            if not chunk:
                break
            chunks.append(chunk)
            pos += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _fd_budget() -> int:
    """How many descriptors a cut may keep open (the soft limit minus what is open and a
    reserve for the gateway's own sockets and files)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    try:
        now = len(os.listdir("/proc/self/fd"))
    except OSError:
        now = 64
    return max(0, min(FD_CAP, soft - now - FD_RESERVE))


def _is_transcript(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) == 4 and parts[0] == "agents" and parts[2] == "sessions"


async def _acquire(lock: Any) -> None:
    """Take a threading lock from the event loop without blocking it (a session write
    in flight holds it for a few ms). Raises TimeoutError after :data:`LOCK_WAIT_S`."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while not lock.acquire(blocking=False):
        if time.monotonic() > deadline:
            raise TimeoutError("a session store write did not finish")
        await asyncio.sleep(0.001)


def _session_locks(gw: Any) -> list[Any]:
    locks = []
    for agent in list(getattr(gw, "agents", {}).values()):
        lock = getattr(getattr(agent.store, "backend", None), "lock", None)
        if lock is not None:
            locks.append(lock)
    return locks


def _timeline_pause(gw: Any) -> Any:
    hooks = getattr(gw, "timeline_hooks", None)
    store = getattr(getattr(hooks, "timeline", None), "store", None)
    pause = getattr(store, "pause_writer", None)
    return pause(LOCK_WAIT_S * 2) if pause is not None else None


async def take_cut(gw: Any, state_dir: Path, items: list[Item]) -> Cut:
    """Hold the writers of gateway ``gw`` and pin every item of ``items`` (the plan of a
    backup of ``state_dir``) as of one instant (see the module docstring). The caller
    closes the returned Cut. Raises TimeoutError when a writer does not stop in time."""
    cut = Cut()
    opened: dict[str, int | None] = {}
    locks: list[Any] = []
    pause = started = pinned = None
    try:
        for i in items:  # opened before the hold: inside it only BEGIN + one read
            if i.kind == "sqlite":
                cut.sqlite[i.rel] = sqlite3.connect(
                    f"file:{i.path}?mode=ro", uri=True, timeout=30.0, isolation_level=None,
                    check_same_thread=False)  # a worker thread copies it
        opened = _open_lines(items, _fd_budget())  # likewise: inside it only fstat
        # session writes first: waiting for one in flight delays no turn (they are
        # saved in the background); a parked timeline writer delays every turn's end
        for lock in _session_locks(gw):
            await _acquire(lock)
            locks.append(lock)
        pause = _timeline_pause(gw)
        if pause is not None:
            await asyncio.wait_for(asyncio.shield(pause.parked), LOCK_WAIT_S)
        started = time.perf_counter()
        cut.at = time.time()
        _pin(cut, state_dir, items, opened)  # no await: no transcript append meanwhile
        pinned = time.perf_counter()
    except BaseException:
        for fd in opened.values():
            if fd is not None:
                os.close(fd)
        cut.close()
        raise
    finally:
        for lock in locks:
            lock.release()
        if pause is not None:
            pause.resume()
        if started is not None:
            cut.hold_ms = (time.perf_counter() - started) * 1000
    log.info("backup_cut", hold_ms=round(cut.hold_ms, 3), databases=len(cut.sqlite),
             pin_ms=round(((pinned or started or 0) - (started or 0)) * 1000, 3),
             logs=len(cut.sized), new_files=len(cut.extra))
    return cut


def _open_lines(items: list[Item], budget: int) -> dict[str, int | None]:
    """``{rel: fd | None}`` of the append-only files: a descriptor while ``budget``
    lasts (files that may be replaced first, transcripts after: they never are)."""
    lines = sorted((i for i in items if i.kind == "lines"),
                   key=lambda i: _is_transcript(i.rel))
    out: dict[str, int | None] = {}
    for i in lines:
        fd = None
        if budget > 0:
            try:
                fd = os.open(i.path, os.O_RDONLY)
                budget -= 1
            except FileNotFoundError:
                continue
            except OSError:  # EMFILE, ENFILE: sized by path at the cut
                budget = 0
        out[i.rel] = fd
    return out


def _pin(cut: Cut, state_dir: Path, items: list[Item], opened: dict[str, int | None]) -> None:
    """The part under the held locks: read snapshots, pending logs, sizes. Takes over
    the descriptors of ``opened``."""
    for conn in cut.sqlite.values():
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # snapshot taken
    for i in items:
        if i.kind == "pending":
            try:
                cut.data[i.rel] = i.path.read_bytes()
            except FileNotFoundError:
                pass
    by_rel = {i.rel: i for i in items}
    for rel in list(opened):
        fd = opened.pop(rel)  # the cut owns it now
        sized = _size(by_rel[rel].path, fd, check=not _is_transcript(rel))
        if sized is not None:
            cut.sized[rel] = sized
    cut.extra = _new_lines(state_dir, items)
    for i in cut.extra:  # a new session's transcript, ...: few
        sized = _size(i.path, None, check=False)
        if sized is not None:
            cut.sized[i.rel] = sized


def _size(path: Path, fd: int | None, *, check: bool) -> Sized | None:
    """The file's size now, keeping ``fd`` (None: sized by path). ``check``: the file
    may have been replaced since ``fd`` was opened (compaction, rotation): then the new
    one is sized by path."""
    try:
        if fd is not None:
            st = os.fstat(fd)
            if not check or os.stat(path).st_ino == st.st_ino:
                return Sized(st.st_size, st.st_ino, fd)
            os.close(fd)
        st = os.stat(path)
        return Sized(st.st_size, st.st_ino, None)
    except FileNotFoundError:
        if fd is not None:
            os.close(fd)
        return None


def _new_lines(state_dir: Path, items: list[Item]) -> list[Item]:
    """``.jsonl`` files created since the plan in a directory that holds some, or a
    database (a new session's transcript)."""
    known = {str(i.path) for i in items}
    dirs = {str(i.path.parent) for i in items if i.kind in ("lines", "sqlite")}
    out = []
    for d in sorted(dirs):
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if e.path in known or not e.name.endswith(".jsonl") \
                    or not e.is_file(follow_symlinks=False):
                continue
            path = Path(e.path)
            try:
                out.append(Item(path.relative_to(state_dir).as_posix(), "lines", path))
            except ValueError:
                continue
    return out


def cut_hook(gw: Any, loop: asyncio.AbstractEventLoop) -> Callable[[Path, list[Item]], Cut]:
    """``create_backup``'s ``cut`` for a backup made in a worker thread of gateway ``gw``
    (whose event loop is ``loop``): takes the cut on that loop and waits for it."""
    def take(state_dir: Path, items: list[Item]) -> Cut:
        return asyncio.run_coroutine_threadsafe(take_cut(gw, state_dir, items),
                                                loop).result(LOCK_WAIT_S * 4)
    return take
