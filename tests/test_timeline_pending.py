"""The SQLite timeline's group commit (issue 9 "Disk"): a turn's events are acknowledged
once they are a line of ``timeline.db-pending`` and reach SQLite in one transaction per
flush. Asserted on the files: the transactions and bytes a flush writes, what a kill -9
leaves, what a replay writes (once), what a read-only opener sees while events are still pending.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import textwrap
from pathlib import Path

from structlog.testing import capture_logs

from runtime.clock import FakeClock
from runtime.timeline import Timeline

REPO = Path(__file__).resolve().parent.parent
T0 = 1_767_225_600.0
KEY = "agent:main:telegram:dm:7"
ANSWER = {"text": "echo: a reply of ordinary length", "tool_calls": [], "model": "m",
          "provider": "p", "usage": {"input": 3000, "output": 6}, "stop_reason": "stop"}


def _committed(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT count(*) FROM timeline_events").fetchone()[0]
    finally:
        conn.close()


async def _turns(tl: Timeline, sid: str, n: int, start: int = 0) -> None:
    """``n`` turns as the gateway writes them: one append_events call per turn."""
    for i in range(start, start + n):
        await tl.clock.advance(1)
        events = [("USER_INPUT", {"text": f"message {i}", "sender": "7"}, None),
                  ("LLM_RESPONSE", ANSWER, None)]
        if i == 0:
            events.insert(0, ("SESSION_CREATE", KEY, None))
        results = await tl.append_events(sid, events)
        assert not [r for r in results if isinstance(r, BaseException)], results


def _commits(db: Path) -> int:
    """The database header's file change counter: +1 per committed write transaction in
    rollback-journal mode (SQLite file format, "file change counter", offset 24)."""
    return int.from_bytes(db.read_bytes()[24:28], "big")


def _in_database_file(db: Path, tmp: Path) -> int:
    """Events in ``db`` itself, any WAL left out (read from a copy of the file alone)."""
    copy = tmp / "file-only.db"
    copy.write_bytes(db.read_bytes())
    try:
        return _committed(copy)
    finally:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(str(copy) + suffix).unlink(missing_ok=True)


async def test_turns_share_one_transaction_written_once_into_the_database_file(tmp_path):
    """Issue 9 "Disk": 200 turns are 200 lines of the pending log and then ONE
    transaction, written straight into timeline.db (rollback journal: no WAL to copy it
    from again); a new database has 4 KiB pages, which pack ~370-byte event rows far
    better than 1 KiB pages did (a third row did not fit: 27% of each page empty)."""
    db = tmp_path / "timeline.db"
    tl = await Timeline.open_sqlite(db, clock=FakeClock(T0))
    size0, commits0 = db.stat().st_size, _commits(db)
    await _turns(tl, "s1", 200)
    # acknowledged, not yet in SQLite: they are lines of the pending log
    assert (_committed(db), _commits(db)) == (0, commits0)
    pending = Path(str(db) + "-pending")
    assert len(pending.read_bytes().splitlines()) == 200
    await tl.store.flush()
    assert _commits(db) == commits0 + 1 and pending.stat().st_size == 0
    assert _in_database_file(db, tmp_path) == 401
    assert not Path(str(db) + "-wal").exists()
    assert db.read_bytes()[18:20] == b"\x01\x01"  # file format: rollback journal, not WAL
    assert Path(str(db) + "-journal").stat().st_size == 0  # truncated at the commit
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096
    finally:
        conn.close()
    per_turn = (db.stat().st_size - size0) / 200
    assert per_turn < 780, per_turn  # 1 KiB pages: 819
    assert (await tl.verify()).ok
    await tl.close()


async def test_a_wal_database_is_converted_when_nothing_else_has_it_open(tmp_path):
    """A timeline.db an older version left in WAL mode: while another process has it open
    it stays in WAL (warning) and works; the next open with nobody else on it converts it,
    every event kept."""
    db = tmp_path / "timeline.db"
    tl = await Timeline.open_sqlite(db, clock=FakeClock(T0))
    await _turns(tl, "s1", 3)
    await tl.close()
    other = sqlite3.connect(db)
    assert other.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    other.execute("SELECT count(*) FROM timeline_events").fetchone()
    with capture_logs() as logs:
        tl = await Timeline.open_sqlite(db, clock=FakeClock(T0 + 100))
    assert [e["mode"] for e in logs if e["event"] == "timeline_journal_mode_kept"][:1] == ["wal"]
    await _turns(tl, "s1", 2, start=3)
    await tl.store.flush()
    assert (await tl.verify()).ok
    await tl.close()
    other.close()
    assert db.read_bytes()[18:20] == b"\x02\x02"  # still WAL
    tl = await Timeline.open_sqlite(db, clock=FakeClock(T0 + 200))
    assert db.read_bytes()[18:20] == b"\x01\x01"
    assert not Path(str(db) + "-wal").exists()
    assert len(await tl.get_timeline("s1")) == 11 and (await tl.verify()).ok
    await tl.close()


CHILD = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {repo!r})
    import structlog, logging
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    from runtime.timeline import Timeline

    async def main():
        tl = await Timeline.open_sqlite({db!r})
        await tl.init_timeline("k", {key!r})
        for i in range(200):
            await tl.append_event("k", "USER_INPUT", {{"text": f"m{{i}}"}})
        print("acknowledged", flush=True)
        await asyncio.Event().wait()  # until the test kills it

    asyncio.run(main())
""")


async def test_kill_9_before_the_flush_loses_nothing_acknowledged(tmp_path):
    db = tmp_path / "timeline.db"
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(repo=str(REPO), db=str(db), key=KEY))
    proc = await asyncio.create_subprocess_exec(sys.executable, str(script),
                                                stdout=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(30):
            assert (await proc.stdout.readline()).strip() == b"acknowledged"
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert _committed(db) == 0  # all 201 were only in the pending log

    with capture_logs() as logs:
        tl = await Timeline.open_sqlite(db)
    assert [e["events"] for e in logs if e["event"] == "timeline_pending_replayed"] == [201]
    assert _committed(db) == 201
    assert Path(str(db) + "-pending").stat().st_size == 0
    events = await tl.get_timeline("k")
    assert [e.content["text"] for e in events[1:]] == [f"m{i}" for i in range(200)]
    ev = await tl.append_event("k", "USER_INPUT", {"text": "after the crash"})
    assert ev.seq == 202
    assert (await tl.verify()).ok
    await tl.close()


async def test_a_replayed_log_already_committed_writes_nothing_twice(tmp_path):
    """A crash between the flush's commit and the log's truncation."""
    db = tmp_path / "timeline.db"
    tl = await Timeline.open_sqlite(db, clock=FakeClock(T0))
    await _turns(tl, "s1", 5)
    await _turns(tl, "s2", 3)
    pending = Path(str(db) + "-pending")
    left_over = pending.read_bytes()
    await tl.close()  # commits and empties the log
    assert _committed(db) == 11 + 7
    pending.write_bytes(left_over)

    tl = await Timeline.open_sqlite(db, clock=FakeClock(T0 + 100))
    assert _committed(db) == 18 and pending.stat().st_size == 0
    report = await tl.verify()
    assert report.ok and report.events_checked == 18, str(report)
    await tl.close()


async def _crash(tl: Timeline, db: Path) -> tuple[Path, list[bytes]]:
    """Close ``tl`` as a kill would leave it: nothing pending reaches SQLite. Returns the
    pending log and its lines."""
    pending = Path(str(db) + "-pending")
    data = pending.read_bytes()
    tl.store._writer._rows.clear()
    tl.store._writer._dirty.clear()
    await tl.close()
    return pending, data.splitlines(keepends=True)


async def test_a_torn_last_line_is_ignored_and_the_rest_replayed(tmp_path):
    db = tmp_path / "timeline.db"
    tl = await Timeline.open_sqlite(db, clock=FakeClock(T0))
    await _turns(tl, "s1", 4)
    pending, lines = await _crash(tl, db)
    pending.write_bytes(b"".join(lines[:3]) + lines[3][:40])  # the 4th write was cut off

    with capture_logs() as logs:
        tl = await Timeline.open_sqlite(db, clock=FakeClock(T0 + 100))
    assert [e["lines"] for e in logs if e["event"] == "timeline_pending_torn"] == [1]
    assert [e.seq for e in await tl.get_timeline("s1")] == list(range(1, 8))
    assert (await tl.verify()).ok
    await tl.close()


async def test_a_read_only_opener_sees_events_still_pending(tmp_path):
    db = tmp_path / "timeline.db"
    tl = await Timeline.open_sqlite(db, clock=FakeClock(T0))
    await _turns(tl, "s1", 3)
    await tl.store.flush()
    await _turns(tl, "s1", 2, start=3)  # committed 7, pending 4
    await _turns(tl, "s2", 2)  # a session that exists only in the pending log
    await tl.end_timeline("s2", "reset")
    assert _committed(db) == 7

    ro = await Timeline.open_sqlite(db, readonly=True)
    assert [e.seq for e in await ro.get_timeline("s1")] == list(range(1, 12))
    assert [e.seq for e in await ro.get_timeline("s1", after_seq=6, limit=3)] == [7, 8, 9]
    assert (await ro.get_info("s1")).event_count == 11
    s2 = await ro.get_info("s2")
    assert (s2.status, s2.event_count) == ("archived", 6)
    rows = await ro.list_timelines()
    assert [(r.session_id, r.event_count) for r in rows] == [("s2", 6), ("s1", 11)]
    assert [r.session_id for r in await ro.list_timelines(status="active")] == ["s1"]
    report = await ro.verify()
    assert report.ok and report.events_checked == 17, str(report)
    await ro.close()
    await tl.close()


async def test_a_log_that_contradicts_the_database_is_kept_aside(tmp_path):
    db = tmp_path / "timeline.db"
    tl = await Timeline.open_sqlite(db, clock=FakeClock(T0))
    await _turns(tl, "s1", 2)
    await _turns(tl, "s2", 2)
    pending, lines = await _crash(tl, db)
    pending.write_bytes(b"".join(lines[1:]))  # s1's first batch (seq 1-3) is missing

    with capture_logs() as logs:
        tl = await Timeline.open_sqlite(db, clock=FakeClock(T0 + 100))
    bad = [e for e in logs if e["event"] == "state_file_corrupt"]
    assert len(bad) == 1 and "session s1" in bad[0]["error"]
    aside = [p for p in os.listdir(tmp_path) if ".corrupt-" in p]
    assert len(aside) == 1 and (tmp_path / aside[0]).read_bytes() == b"".join(lines[1:])
    assert [e.seq for e in await tl.get_timeline("s2")] == [1, 2, 3, 4, 5]  # replayed
    assert await tl.store.info("s1") is None
    assert (await tl.verify()).ok
    await tl.close()


async def test_a_fresh_database_gets_its_schema_in_one_transaction(tmp_path):
    """Creating the tables, indexes and triggers is one write transaction, not one per
    statement (each a commit with its fsyncs in rollback-journal mode: ~40 ms of a fresh
    gateway's cold start)."""
    db = tmp_path / "timeline.db"
    tl = await Timeline.open_sqlite(db, clock=FakeClock(T0))
    await tl.close()
    assert _commits(db) == 1
