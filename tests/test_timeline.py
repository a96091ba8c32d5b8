"""Timeline: ordering, hash chain, tamper detection, immutability, crash safety, export.

Runs the real SQLite store in a temp dir; time comes from FakeClock. The tamper tests
open the database file with a second sqlite3 connection, drop the trigger that guards the
table and edit a stored row, exactly what an attacker with file access would do.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import signal
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest

from runtime.clock import FakeClock
from runtime.timeline import (
    Timeline,
    TimelineArchivedError,
    TimelineClosedError,
    TimelineError,
    TimelineExistsError,
    TimelineNotFoundError,
)
from runtime.timeline.export import (
    export_jsonl,
    rebuild_transcript_messages,
    replay_lines,
    verify_export_file,
    write_export_file,
)
from runtime.timeline.model import GENESIS_HASH, event_hash

REPO = Path(__file__).resolve().parent.parent
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
SID = "sess-1"
KEY = "agent:main:telegram:dm:42"

# One turn with a tool call, as the turn loop would record it.
CONVERSATION = [
    ("USER_INPUT", {"text": "列出 /tmp 里的文件", "message_id": "m1", "sender": "42"}),
    ("LLM_RESPONSE", {"text": "Let me look.", "tool_calls": [
        {"id": "call_1", "name": "exec", "arguments": {"cmd": "ls /tmp"}}],
        "model": "gpt-test", "provider": "openai", "usage": {"input": 120, "output": 14},
        "stop_reason": "toolUse"}),
    ("TOOL_CALL", {"id": "call_1", "name": "exec", "arguments": {"cmd": "ls /tmp"}}),
    ("TOOL_RESULT", {"tool_call_id": "call_1", "name": "exec", "result": "a.txt\nb.txt",
                     "is_error": False, "duration_ms": 31}),
    ("LLM_RESPONSE", {"text": "There are two files: a.txt and b.txt.", "tool_calls": [],
                      "model": "gpt-test", "provider": "openai",
                      "usage": {"input": 160, "output": 12}, "stop_reason": "stop"}),
    ("SYSTEM_EVENT", {"text": "exec finished", "source": "exec", "ts": 1_767_225_605_000}),
]


async def _open(tmp_path: Path, clock: FakeClock | None = None) -> Timeline:
    return await Timeline.open_sqlite(tmp_path / "timeline.db", clock=clock or FakeClock(T0))


async def _conversation(tl: Timeline, sid: str = SID) -> list:
    clock = tl.clock
    await tl.init_timeline(sid, KEY)
    out = []
    for etype, content in CONVERSATION:
        await clock.advance(1.5)
        out.append(await tl.append_event(sid, etype, content))
    return out


@pytest.fixture
async def tl(tmp_path):
    timeline = await _open(tmp_path)
    yield timeline
    await timeline.close()


def _tamper(db: Path, sql: str, args: tuple = (), trigger: str = "timeline_events_no_update"):
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute(sql, args)
    conn.close()


# ---- ordering and chain -------------------------------------------------------------------


async def test_conversation_produces_ordered_chained_events(tl):
    appended = await _conversation(tl)
    events = await tl.get_timeline(SID)
    assert [e.event_type for e in events] == ["SESSION_CREATE"] + [t for t, _ in CONVERSATION]
    assert [e.seq for e in events] == list(range(1, 8))
    assert events[0].content == {"session_key": KEY}
    assert [e.content for e in events[1:]] == [c for _, c in CONVERSATION]
    assert events[1:] == appended
    # FakeClock at T0, +1.5 s before each append
    assert [e.timestamp for e in events] == [int(T0 * 1000) + 1500 * i for i in range(7)]
    assert events[0].prev_hash == GENESIS_HASH
    for prev, ev in itertools.pairwise(events):
        assert ev.prev_hash == prev.hash
    assert len({e.event_id for e in events}) == 7


async def test_hash_is_sha256_of_documented_canonical_json(tl):
    await _conversation(tl)
    for ev in await tl.get_timeline(SID):
        fields = ev.to_dict()
        del fields["hash"]
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert ev.hash == hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        assert event_hash(ev) == ev.hash


async def test_chain_verifies(tl):
    await _conversation(tl)
    await _conversation(tl, "sess-2")
    report = await tl.verify()
    assert report.ok, str(report)
    assert (report.sessions_checked, report.events_checked) == (2, 14)
    one = await tl.verify(SID)
    assert one.ok and one.events_checked == 7
    with pytest.raises(TimelineNotFoundError):
        await tl.verify("nope")


async def test_reopen_continues_the_chain(tmp_path):
    tl = await _open(tmp_path)
    await _conversation(tl)
    await tl.close()
    tl = await _open(tmp_path)
    ev = await tl.append_event(SID, "USER_INPUT", {"text": "again"})
    assert ev.seq == 8
    assert ev.prev_hash == (await tl.get_timeline(SID))[-2].hash
    assert (await tl.verify()).ok
    await tl.close()


# ---- tamper detection ---------------------------------------------------------------------

NEW_ID = "00000000-0000-4000-8000-000000000000"


@pytest.mark.parametrize(
    ("column", "assignment", "reason", "at_seq"),
    [
        ("content", "content = replace(content, 'a.txt', 'c.txt')", "hash mismatch", 5),
        ("content one byte", "content = substr(content, 1, length(content) - 2) || '1}'",
         "hash mismatch", 5),
        ("event_id", f"event_id = '{NEW_ID}'", "hash mismatch", 5),
        ("event_type", "event_type = 'SYSTEM_EVENT'", "hash mismatch", 5),
        ("timestamp later", "timestamp = timestamp + 1", "hash mismatch", 5),
        ("timestamp earlier", "timestamp = timestamp - 100000", "timestamp decreased", 5),
        ("prev_hash", "prev_hash = substr(prev_hash, 1, 63) || 'x'",
         "prev_hash does not match previous event", 5),
        ("hash", "hash = substr(hash, 1, 63) || 'x'", "hash mismatch", 5),
        ("seq", "seq = 99", "seq gap: expected 5, got 6", 6),
        ("session_id", "session_id = 'zzz'", "seq gap: expected 5, got 6", 6),
    ],
)
async def test_editing_any_field_breaks_verify_at_that_event(tmp_path, column, assignment, reason,
                                                             at_seq):
    tl = await _open(tmp_path)
    await _conversation(tl, "other")  # an intact neighbour must not be blamed
    await _conversation(tl)
    original = {e.seq: e for e in await tl.get_timeline(SID)}
    assert (await tl.verify()).ok
    _tamper(tmp_path / "timeline.db",
            f"UPDATE timeline_events SET {assignment} WHERE session_id = ? AND seq = 5", (SID,))

    report = await tl.verify(SID)
    assert not report.ok
    assert report.reason == reason, str(report)
    assert (report.session_id, report.seq) == (SID, at_seq)
    expected_id = NEW_ID if column == "event_id" else original[at_seq].event_id
    assert report.event_id == expected_id
    assert not (await tl.verify()).ok  # the all-sessions pass fails too
    assert (await tl.verify("other")).ok
    await tl.close()


async def test_moved_event_is_reported_as_orphan_in_full_verify(tmp_path):
    tl = await _open(tmp_path)
    await _conversation(tl)
    target = (await tl.get_timeline(SID))[4]
    _tamper(tmp_path / "timeline.db", "UPDATE timeline_events SET session_id = 'a-moved'"
            " WHERE event_id = ?", (target.event_id,))
    report = await tl.verify()
    assert report.reason == "event belongs to no timeline"
    assert report.event_id == target.event_id
    await tl.close()


async def test_deleted_tail_event_is_a_head_mismatch(tmp_path):
    tl = await _open(tmp_path)
    await _conversation(tl)
    await tl.store.flush()  # the file is edited below: commit the pending log first
    _tamper(tmp_path / "timeline.db", "DELETE FROM timeline_events WHERE session_id = ?"
            " AND seq = 7", (SID,), trigger="timeline_events_no_delete")
    report = await tl.verify(SID)
    assert report.reason == "timeline head mismatch"
    assert report.seq == 6
    assert "seq 7" in report.detail
    await tl.close()


# ---- immutability -------------------------------------------------------------------------


async def test_triggers_refuse_update_and_delete(tl):
    await _conversation(tl)
    await tl.store.flush()  # the file is edited below: commit the pending log first
    conn = sqlite3.connect(tl.store.path, isolation_level=None)
    refused = "timeline events are immutable: {} refused"
    with pytest.raises(sqlite3.IntegrityError, match=refused.format("UPDATE")):
        conn.execute("UPDATE timeline_events SET content = '{}' WHERE seq = 2")
    with pytest.raises(sqlite3.IntegrityError, match=refused.format("DELETE")):
        conn.execute("DELETE FROM timeline_events WHERE seq = 2")
    with pytest.raises(sqlite3.IntegrityError, match="timelines are permanent: DELETE refused"):
        conn.execute("DELETE FROM timelines")
    with pytest.raises(sqlite3.IntegrityError, match="head cannot move backwards"):
        conn.execute("UPDATE timelines SET last_seq = 3")
    conn.close()
    assert len(await tl.get_timeline(SID)) == 7
    assert (await tl.verify()).ok


async def test_archived_timeline_refuses_appends_and_unarchiving(tl):
    await _conversation(tl)
    end = await tl.end_timeline(SID, reason="user reset")
    assert (end.event_type, end.seq, end.content) == ("SESSION_END", 8, {"reason": "user reset"})
    with pytest.raises(TimelineArchivedError, match=f"'{SID}'.*archived"):
        await tl.append_event(SID, "USER_INPUT", {"text": "too late"})
    with pytest.raises(TimelineArchivedError):
        await tl.end_timeline(SID)
    info = await tl.get_info(SID)
    assert (info.status, info.ended_at, info.event_count) == ("archived", end.timestamp, 8)

    conn = sqlite3.connect(tl.store.path, isolation_level=None)
    with pytest.raises(sqlite3.IntegrityError, match="cannot un-archive"):
        conn.execute("UPDATE timelines SET status = 'active' WHERE session_id = ?", (SID,))
    with pytest.raises(sqlite3.IntegrityError, match="archived or unknown: INSERT refused"):
        conn.execute("INSERT INTO timeline_events VALUES ('x', ?, 9, 0, 'USER_INPUT', '{}', 'p',"
                     " 'h')", (SID,))
    conn.close()
    assert len(await tl.get_timeline(SID)) == 8
    assert (await tl.verify()).ok


async def test_bad_input_is_refused_with_clear_errors(tl):
    with pytest.raises(TimelineNotFoundError, match="init_timeline"):
        await tl.append_event("ghost", "USER_INPUT", {"text": "hi"})
    with pytest.raises(TimelineNotFoundError):
        await tl.get_timeline("ghost")
    await tl.init_timeline(SID, KEY)
    with pytest.raises(TimelineExistsError):
        await tl.init_timeline(SID, KEY)
    with pytest.raises(ValueError, match="unknown timeline event_type 'CHAT'"):
        await tl.append_event(SID, "CHAT", {"text": "hi"})
    with pytest.raises(ValueError, match="init_timeline"):
        await tl.append_event(SID, "SESSION_CREATE", {})
    with pytest.raises(TypeError, match="JSON object"):
        await tl.append_event(SID, "USER_INPUT", "hi")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="JSON-serialisable"):
        await tl.append_event(SID, "USER_INPUT", {"when": object()})
    with pytest.raises(ValueError, match="JSON-serialisable"):
        await tl.append_event(SID, "USER_INPUT", {"x": float("nan")})
    with pytest.raises(ValueError, match="session_id"):
        await tl.init_timeline("", KEY)
    assert [e.seq for e in await tl.get_timeline(SID)] == [1]


async def test_failed_write_fails_only_its_caller(tl):
    """A row SQLite would reject (NULL content, a duplicate event id) inside a batch is
    refused before it is acknowledged; the rest of the batch is written."""
    await tl.init_timeline(SID, KEY)
    store = tl.store
    calls = [store.append(SID, f"id-{i}", "USER_INPUT", 1, f'{{"i":{i}}}') for i in range(5)]
    calls.insert(2, store.append(SID, "bad", "USER_INPUT", 1, None))  # type: ignore[arg-type]
    calls.insert(4, store.append(SID, "id-0", "USER_INPUT", 1, '{"i":"again"}'))
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[2], TimelineError) and "content must be JSON text" in str(results[2])
    assert isinstance(results[4], TimelineError) and "already in the timeline" in str(results[4])
    good = [r for i, r in enumerate(results) if i not in (2, 4)]
    assert [e.seq for e in good] == [2, 3, 4, 5, 6]
    assert [e.content["i"] for e in await tl.get_timeline(SID, after_seq=1)] == [0, 1, 2, 3, 4]
    assert (await tl.verify()).ok
    # an id already committed to SQLite is refused as well
    with pytest.raises(TimelineError, match="already in the timeline"):
        await store.append(SID, "id-1", "USER_INPUT", 1, "{}")


async def test_closed_timeline_refuses_work(tmp_path):
    tl = await _open(tmp_path)
    await tl.init_timeline(SID, KEY)
    await tl.close()
    with pytest.raises(TimelineClosedError):
        await tl.append_event(SID, "USER_INPUT", {"text": "x"})
    with pytest.raises(TimelineClosedError):
        await tl.get_timeline(SID)


# ---- time ---------------------------------------------------------------------------------


async def test_clock_stepping_back_keeps_timestamps_non_decreasing(tl):
    clock: FakeClock = tl.clock
    await tl.init_timeline(SID, KEY)
    await clock.advance(10)
    a = await tl.append_event(SID, "USER_INPUT", {"text": "a"})
    clock.set_wall(T0 - 3600)  # NTP steps the clock back an hour
    b = await tl.append_event(SID, "USER_INPUT", {"text": "b"})
    c = await tl.append_event(SID, "USER_INPUT", {"text": "c"})
    clock.set_wall(T0 + 20)
    d = await tl.append_event(SID, "USER_INPUT", {"text": "d"})
    assert a.timestamp == int((T0 + 10) * 1000)
    assert b.timestamp == c.timestamp == a.timestamp
    assert d.timestamp == int((T0 + 20) * 1000)
    assert [e.seq for e in (a, b, c, d)] == [2, 3, 4, 5]
    assert (await tl.verify()).ok


# ---- concurrency and crash safety ---------------------------------------------------------


async def test_100_concurrent_sessions_keep_valid_chains(tl):
    sessions = [f"s{i:03d}" for i in range(100)]
    await asyncio.gather(*(tl.init_timeline(s, f"agent:main:webchat:dm:{s}") for s in sessions))

    async def talk(sid: str) -> None:
        for i in range(50):
            await tl.append_event(sid, "USER_INPUT", {"text": f"{sid} #{i}"})
            if i % 7 == 0:
                await asyncio.sleep(0)

    await asyncio.gather(*(talk(s) for s in sessions))
    report = await tl.verify()
    assert report.ok, str(report)
    assert (report.sessions_checked, report.events_checked) == (100, 100 * 51)
    for sid in sessions[::17]:
        events = await tl.get_timeline(sid)
        assert [e.seq for e in events] == list(range(1, 52))
        assert [e.content["text"] for e in events[1:]] == [f"{sid} #{i}" for i in range(50)]
    infos = await tl.list_timelines()
    assert len(infos) == 100 and all(i.event_count == 51 for i in infos)


CHILD = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {repo!r})
    import structlog, logging
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    from runtime.timeline import Timeline

    async def main():
        tl = await Timeline.open_sqlite({db!r})
        sessions = [f"k{{i}}" for i in range(20)]
        for s in sessions:
            await tl.init_timeline(s, "agent:main:kill:" + s)
        done = 0
        async def loop(s):
            nonlocal done
            i = 0
            while True:
                await tl.append_event(s, "USER_INPUT", {{"text": "x" * (i % 300), "i": i}})
                i += 1
                done += 1
                if done % 100 == 0:
                    print(done, flush=True)
        await asyncio.gather(*(loop(s) for s in sessions))

    asyncio.run(main())
""")


async def test_kill_9_during_appends_leaves_every_chain_valid(tmp_path):
    db = tmp_path / "timeline.db"
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(repo=str(REPO), db=str(db)))
    proc = await asyncio.create_subprocess_exec(sys.executable, str(script),
                                                stdout=asyncio.subprocess.PIPE)
    acknowledged = 0
    try:
        async with asyncio.timeout(30):
            while acknowledged < 3000:
                line = await proc.stdout.readline()
                if not line:
                    break
                acknowledged = int(line)
    finally:
        proc.send_signal(signal.SIGKILL)  # mid-append: the writer is always busy here
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert acknowledged >= 3000

    tl = await Timeline.open_sqlite(db)
    report = await tl.verify()
    assert report.ok, str(report)
    assert report.sessions_checked == 20
    # every append the child saw return was committed before the kill
    assert report.events_checked - 20 >= acknowledged
    # and the store takes appends again after the crash
    ev = await tl.append_event("k0", "USER_INPUT", {"text": "after the crash"})
    assert ev.seq == (await tl.get_info("k0")).event_count
    assert (await tl.verify("k0")).ok
    await tl.close()


# ---- reading ------------------------------------------------------------------------------


async def test_get_timeline_filters(tl):
    await _conversation(tl)
    events = await tl.get_timeline(SID)
    assert [e.seq for e in await tl.get_timeline(SID, after_seq=4)] == [5, 6, 7]
    assert [e.seq for e in await tl.get_timeline(SID, from_ts=events[3].timestamp)] == [4, 5, 6, 7]
    assert [e.seq for e in await tl.get_timeline(SID, from_ts=events[3].timestamp + 1)] == [5, 6, 7]
    assert [e.seq for e in await tl.get_timeline(SID, limit=2)] == [1, 2]
    assert [e.seq for e in await tl.get_timeline(SID, after_seq=2, limit=3)] == [3, 4, 5]
    assert [e.seq for e in await tl.get_timeline(SID, from_ts=events[2].timestamp,
                                                 after_seq=4, limit=1)] == [5]
    assert await tl.get_timeline(SID, after_seq=7) == []
    assert await tl.get_timeline(SID, limit=0) == []
    with pytest.raises(ValueError):
        await tl.get_timeline(SID, limit=-1)


async def test_list_timelines_and_lookup_by_key(tl):
    clock: FakeClock = tl.clock
    await tl.init_timeline("old", KEY)
    await tl.append_event("old", "USER_INPUT", {"text": "hi"})
    await tl.end_timeline("old", "reset")
    await clock.advance(60)
    await tl.init_timeline("new", KEY)
    await tl.init_timeline("elsewhere", "agent:main:main")
    latest = await tl.latest_for_key(KEY)
    assert latest.session_id == "new" and latest.status == "active" and latest.event_count == 1
    assert await tl.latest_for_key("agent:nobody:main") is None
    rows = await tl.list_timelines(session_key=KEY)
    assert [(r.session_id, r.status, r.event_count) for r in rows] == [
        ("new", "active", 1), ("old", "archived", 3)]
    assert rows[1].created_at == int(T0 * 1000) and rows[1].ended_at == int(T0 * 1000)
    assert {r.session_id for r in await tl.list_timelines(status="active")} == {"new", "elsewhere"}
    with pytest.raises(ValueError):
        await tl.list_timelines(status="closed")


# ---- export, replay, rebuild --------------------------------------------------------------


async def test_export_verifies_offline_and_names_a_tampered_line(tl, tmp_path):
    await _conversation(tl)
    await tl.end_timeline(SID)
    lines = await tl.export(SID)
    header = json.loads(lines[0])
    events = await tl.get_timeline(SID)
    assert header["type"] == "timeline_export" and header["count"] == 8
    assert header["session_key"] == KEY and header["head_hash"] == events[-1].hash
    assert header["exported_at"] == "2026-01-01T00:00:09.000Z"
    path = tmp_path / "export.jsonl"
    write_export_file(path, lines)
    report = verify_export_file(path)
    assert report.ok and report.events_checked == 8, str(report)

    # a partial export (seq 4..8) verifies from its base_hash
    write_export_file(path, export_jsonl(events[3:], session_key=KEY))
    report = verify_export_file(path)
    assert report.ok and report.events_checked == 5, str(report)

    # change the tool result on line 5 (seq 4)
    bad = [json.loads(x) for x in lines]
    bad[4]["content"]["result"] = "a.txt"
    write_export_file(path, [json.dumps(x, ensure_ascii=False) for x in bad])
    report = verify_export_file(path)
    assert (report.ok, report.line, report.seq, report.reason) == (False, 5, 4, "hash mismatch")
    assert report.event_id == events[3].event_id

    # drop line 4: the chain names the gap on the line after it
    write_export_file(path, lines[:3] + lines[4:])
    report = verify_export_file(path)
    assert (report.line, report.reason) == (4, "seq gap: expected 3, got 4")

    # cut the tail: header count and head_hash no longer match
    write_export_file(path, lines[:-1])
    assert verify_export_file(path).reason == "count mismatch"

    path.write_text("not json\n")
    assert verify_export_file(path).reason == "invalid export header"


async def test_export_jsonl_rejects_empty_and_mixed_input(tl):
    with pytest.raises(ValueError, match="no events"):
        export_jsonl([])
    a = await _conversation(tl)
    b = await _conversation(tl, "sess-2")
    with pytest.raises(ValueError, match="single session"):
        export_jsonl(a + b)


async def test_rebuild_matches_original_messages(tl):
    events = await _conversation(tl)
    ts = [e.timestamp for e in events]
    expected = [
        {"role": "user", "content": [{"type": "text", "text": "列出 /tmp 里的文件"}],
         "timestamp": ts[0], "sender": "42", "messageId": "m1"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "toolCall", "id": "call_1", "name": "exec", "arguments": {"cmd": "ls /tmp"}}],
         "model": "gpt-test", "provider": "openai", "usage": {"input": 120, "output": 14},
         "stopReason": "toolUse", "timestamp": ts[1]},
        {"role": "toolResult", "toolCallId": "call_1", "toolName": "exec",
         "content": [{"type": "text", "text": "a.txt\nb.txt"}], "isError": False,
         "timestamp": ts[3]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "There are two files: a.txt and b.txt."}],
         "model": "gpt-test", "provider": "openai", "usage": {"input": 160, "output": 12},
         "stopReason": "stop", "timestamp": ts[4]},
    ]
    assert rebuild_transcript_messages(await tl.get_timeline(SID)) == expected


async def test_replay_lines_show_local_time_deltas_and_content(tl):
    await _conversation(tl)
    lines = replay_lines(await tl.get_timeline(SID), "Asia/Shanghai")
    assert len(lines) == 7
    assert lines[0].startswith("#1") and "2026-01-01 08:00:00.000 CST" in lines[0]
    assert "SESSION_CREATE" in lines[0] and KEY in lines[0]
    assert "+1.50s" in lines[1] and "turn +0ms" in lines[1] and "列出 /tmp 里的文件" in lines[1]
    assert 'calls exec({"cmd":"ls /tmp"})' in lines[2] and "turn +1.50s" in lines[2]
    assert "result exec in 31ms: a.txt b.txt" in lines[4] and "turn +4.50s" in lines[4]
    assert "[exec] exec finished" in lines[6] and "turn" not in lines[6]
