"""Timeline: tampering with the (unhashed) timelines row and export header is detected.

An attacker with write access to ``timeline.db`` can drop the triggers and edit the
timelines row without touching any hashed event: forge its session_key, un-archive it,
archive it without SESSION_END, move its head. ``verify`` must fail, ``show``/``export``
must refuse the row, and an export header with a forged session_key must not verify.
Opening a database whose triggers were dropped logs ``timeline_triggers_missing``.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from structlog.testing import capture_logs

from runtime.clock import FakeClock
from runtime.timeline import Timeline, TimelineTamperedError
from runtime.timeline.export import export_jsonl, verify_export_file, write_export_file
from runtime.timeline.schema import TRIGGERS
from tests.helpers import base_config

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
SID = "sess-1"
KEY = "agent:main:telegram:dm:42"
EVIL = "agent:main:evil"


async def _session(tmp_path: Path, *, end: bool = False) -> Timeline:
    tl = await Timeline.open_sqlite(tmp_path / "timeline.db", clock=FakeClock(T0))
    await tl.init_timeline(SID, KEY)
    for i in range(3):
        await tl.clock.advance(1)
        await tl.append_event(SID, "USER_INPUT", {"text": f"message {i}"})
    if end:
        await tl.clock.advance(1)
        await tl.end_timeline(SID, "user reset")
    await tl.store.flush()  # the tests edit the file: commit the pending log first
    return tl


def _edit(db: Path, sql: str, *drop: str) -> None:
    """Drop the named triggers (as an attacker could) and run ``sql`` on the timelines row."""
    conn = sqlite3.connect(db, isolation_level=None)
    for trigger in drop:
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute(sql, (SID,))
    conn.close()


async def test_identity_trigger_refuses_a_forged_session_key(tmp_path):
    tl = await _session(tmp_path)
    conn = sqlite3.connect(tl.store.path, isolation_level=None)
    with pytest.raises(sqlite3.IntegrityError, match="identity is permanent"):
        conn.execute("UPDATE timelines SET session_key = ?", (EVIL,))
    with pytest.raises(sqlite3.IntegrityError, match="identity is permanent"):
        conn.execute("UPDATE timelines SET created_at = created_at + 1")
    conn.close()
    assert (await tl.verify()).ok
    await tl.close()


async def test_forged_session_key_fails_verify_and_export(tmp_path):
    tl = await _session(tmp_path)
    first = (await tl.get_timeline(SID))[0]
    _edit(tmp_path / "timeline.db", f"UPDATE timelines SET session_key = '{EVIL}'"
          " WHERE session_id = ?", "timelines_identity_frozen")
    for report in (await tl.verify(SID), await tl.verify()):
        assert (report.ok, report.reason, report.seq) == (False, "session_key mismatch", 1)
        assert report.event_id == first.event_id
        assert EVIL in report.detail and KEY in report.detail
    info = await tl.latest_for_key(EVIL)
    with pytest.raises(TimelineTamperedError, match="SESSION_CREATE says session_key"):
        await tl.check_info(info)
    with pytest.raises(TimelineTamperedError):
        await tl.export(SID)
    await tl.close()


@pytest.mark.parametrize("sql, reason", [
    ("UPDATE timelines SET created_at = created_at - 5000", "timeline row mismatch"),
    ("UPDATE timelines SET last_timestamp = last_timestamp + 1", "timeline head mismatch"),
    ("UPDATE timelines SET last_hash = CASE WHEN substr(last_hash, 1, 1) = 'f' THEN '0' ELSE 'f' END || substr(last_hash, 2)",
     "timeline head mismatch"),
    ("UPDATE timelines SET ended_at = 1", "timeline row mismatch"),
    ("UPDATE timelines SET status = 'archived', ended_at = last_timestamp",
     "archived timeline does not end with SESSION_END"),
])
async def test_edited_active_row_fails_verify(tmp_path, sql, reason):
    tl = await _session(tmp_path)
    _edit(tmp_path / "timeline.db", sql + " WHERE session_id = ?", "timelines_identity_frozen")
    report = await tl.verify(SID)
    assert (report.ok, report.reason) == (False, reason), str(report)
    assert not (await tl.verify()).ok
    with pytest.raises(TimelineTamperedError):
        await tl.check_info(await tl.get_info(SID))
    await tl.close()


@pytest.mark.parametrize("sql", [
    "UPDATE timelines SET status = 'active'",
    "UPDATE timelines SET status = 'active', ended_at = NULL",
])
async def test_unarchived_row_fails_verify(tmp_path, sql):
    tl = await _session(tmp_path, end=True)
    assert (await tl.verify(SID)).ok
    _edit(tmp_path / "timeline.db", sql + " WHERE session_id = ?", "timelines_archived_frozen")
    report = await tl.verify(SID)
    assert (report.ok, report.reason, report.seq) == (
        False, "active timeline ends with SESSION_END", 5), str(report)
    with pytest.raises(TimelineTamperedError, match="status 'active' contradicts"):
        await tl.export(SID)
    await tl.close()


async def test_export_header_session_key_is_checked_against_session_create(tmp_path):
    tl = await _session(tmp_path, end=True)
    lines = await tl.export(SID)
    events = await tl.get_timeline(SID)
    await tl.close()
    path = tmp_path / "export.jsonl"
    write_export_file(path, lines)
    assert verify_export_file(path).ok

    header = json.loads(lines[0])
    header["session_key"] = EVIL
    write_export_file(path, [json.dumps(header)] + lines[1:])
    report = verify_export_file(path)
    assert (report.ok, report.reason, report.line, report.seq) == (
        False, "session_key mismatch", 1, 1)
    assert report.event_id == events[0].event_id and EVIL in report.detail

    # export_jsonl takes the key from SESSION_CREATE and refuses a contradicting one
    assert json.loads(export_jsonl(events)[0])["session_key"] == KEY
    with pytest.raises(ValueError, match="contradicts the SESSION_CREATE"):
        export_jsonl(events, session_key=EVIL)
    # a partial export has no SESSION_CREATE to check against: still verifies
    write_export_file(path, export_jsonl(events[2:], session_key=KEY))
    assert verify_export_file(path).ok


async def test_missing_triggers_are_logged_loudly_and_recreated(tmp_path):
    db = tmp_path / "timeline.db"
    with capture_logs() as logs:
        tl = await _session(tmp_path)
        await tl.close()
    assert not [x for x in logs if x["event"] == "timeline_triggers_missing"]  # fresh file

    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TRIGGER timeline_events_no_update")
    conn.execute("DROP TRIGGER timelines_no_delete")
    conn.close()

    with capture_logs() as logs:  # the CLI's read-only open: reported, not repaired
        ro = await Timeline.open_sqlite(db, readonly=True)
        await ro.close()
    [warn] = [x for x in logs if x["event"] == "timeline_triggers_missing"]
    assert warn["log_level"] == "warning" and "read-only" in warn["action"]
    assert warn["missing"] == ["timeline_events_no_update", "timelines_no_delete"]

    with capture_logs() as logs:  # the gateway's open: reported and recreated
        tl = await Timeline.open_sqlite(db, clock=FakeClock(T0))
        await tl.close()
    [warn] = [x for x in logs if x["event"] == "timeline_triggers_missing"]
    assert warn["log_level"] == "warning" and warn["action"] == "recreated"
    assert warn["missing"] == ["timeline_events_no_update", "timelines_no_delete"]
    conn = sqlite3.connect(db)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")}
    conn.close()
    assert set(TRIGGERS) <= names

    with capture_logs() as logs:  # repaired: silent again
        tl = await Timeline.open_sqlite(db, clock=FakeClock(T0))
        await tl.close()
    assert not [x for x in logs if x["event"] == "timeline_triggers_missing"]


async def test_database_from_before_the_identity_trigger_is_upgraded_silently(tmp_path):
    db = tmp_path / "timeline.db"
    tl = await _session(tmp_path)
    await tl.close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TRIGGER timelines_identity_frozen")
    conn.execute("PRAGMA user_version = 0")  # as written by the previous schema
    conn.close()
    with capture_logs() as logs:
        tl = await Timeline.open_sqlite(db, clock=FakeClock(T0))
        await tl.close()
    assert not [x for x in logs if x["event"] == "timeline_triggers_missing"]
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'timelines_identity_frozen'"
                        ).fetchone()
    conn.close()


# ---- the real CLI, as a subprocess -----------------------------------------------------------


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "--config", str(config), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


async def test_cli_refuses_a_forged_session_key(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    tl = await _session(state)
    await tl.close()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(base_config(state)))
    export = tmp_path / "out.jsonl"
    assert _cli(config, "timeline", "export", SID, "-o", str(export)).returncode == 0
    assert _cli(config, "timeline", "verify", "--file", str(export)).returncode == 0

    _edit(state / "timeline.db", f"UPDATE timelines SET session_key = '{EVIL}'"
          " WHERE session_id = ?", "timelines_identity_frozen")
    r = _cli(config, "timeline", "verify")
    assert r.returncode == 1 and "session_key mismatch" in r.stdout, r.stdout + r.stderr
    assert "first broken event: session sess-1 seq 1 SESSION_CREATE" in r.stdout
    r = _cli(config, "timeline", "verify", EVIL)
    assert r.returncode == 1 and "session_key mismatch" in r.stdout
    for action in ("show", "export", "replay"):
        r = _cli(config, "timeline", action, EVIL)
        assert r.returncode == 1 and r.stdout == "", (action, r.stdout)
        assert "disagrees with its hash chain" in r.stderr and "Traceback" not in r.stderr

    # a hand-forged header on an honest export
    lines = export.read_text().splitlines()
    header = json.loads(lines[0])
    header["session_key"] = EVIL
    export.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    r = _cli(config, "timeline", "verify", "--file", str(export))
    assert r.returncode == 1 and "session_key mismatch" in r.stdout
