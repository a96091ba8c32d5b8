"""Session store: atomic writes, no lost updates, reset policies (issue 2 §5)."""

import asyncio
import json
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from gateway.sessions import SessionStore, read_sessions_file, reset_due
from runtime.clock import FakeClock


def epoch(s: str, tz: str = "UTC") -> float:
    return datetime.fromisoformat(s).replace(tzinfo=ZoneInfo(tz)).timestamp()


async def test_create_writes_at_once_and_flush_waits_for_disk(tmp_path):
    path = tmp_path / "sessions.json"
    store = SessionStore(path, "main", clock=FakeClock(), flush_interval=3600).load()
    entry = await store.create("agent:main:cli:dm:a", chat_type="dm")
    for _ in range(200):  # urgent: written without the (here 1 h) coalescing delay
        if path.exists():
            break
        await asyncio.sleep(0.01)
    await store.flush()
    data = json.loads(path.read_text())
    row = data["sessions"]["agent:main:cli:dm:a"]
    assert row["session_id"] == entry.session_id
    assert row["created_at"].endswith("Z") and row["updated_at"].endswith("Z")


async def test_concurrent_updates_are_never_lost(tmp_path):
    path = tmp_path / "sessions.json"
    store = SessionStore(path, "main", clock=FakeClock(), flush_interval=0.001).load()
    keys = [f"agent:main:cli:dm:{i}" for i in range(50)]
    await asyncio.gather(*(store.create(k) for k in keys))
    for _ in range(20):
        for k in keys:
            store.touch(k, activity=True, counters={"turns": 1})
        await asyncio.sleep(0)
    await store.close()
    reloaded = read_sessions_file(path, "main", 0)
    assert set(reloaded) == set(keys)
    assert all(e.counters["turns"] == 20 for e in reloaded.values())
    assert not list(tmp_path.glob(".*.tmp"))  # temp files never left behind


async def test_heartbeat_touch_does_not_count_as_activity(tmp_path):
    clock = FakeClock()
    store = SessionStore(tmp_path / "s.json", "main", clock=clock).load()
    e = await store.create("k")
    store.touch("k", activity=True)
    before = (e.updated_at, e.last_active_at)
    await clock.advance(60)
    store.touch("k", activity=False, counters={"heartbeats": 1})
    assert (e.updated_at, e.last_active_at) == before
    store.set_updated_at("k", 5.0)
    assert e.updated_at == 5.0


def test_tolerant_load_of_old_files(tmp_path):
    path = tmp_path / "sessions.json"
    path.write_text(json.dumps({"agent:main:main": {"sessionId": "abc", "updatedAt": 1700000000000}}))
    entries = read_sessions_file(path, "main", now=1800000000.0)
    e = entries["agent:main:main"]
    assert e.session_id == "abc"
    assert e.updated_at == 1700000000.0
    assert e.created_at == 1700000000.0  # missing time filled at load (from updatedAt)


def test_corrupt_file_is_reported_not_overwritten(tmp_path):
    path = tmp_path / "sessions.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="sessions.json"):
        SessionStore(path, "main").load()
    assert path.read_text() == "{not json"


class _E:
    def __init__(self, last):
        self.last_active_at = last
        self.updated_at = last


def test_daily_reset_at_hour_in_user_timezone():
    tz = "Europe/Berlin"
    entry = _E(epoch("2026-03-10T03:30:00", tz))
    assert reset_due(entry, mode="daily", now=epoch("2026-03-10T03:59:00", tz), tz=tz) is None
    assert reset_due(entry, mode="daily", now=epoch("2026-03-10T04:00:01", tz), tz=tz) == "daily"
    late = _E(epoch("2026-03-10T04:30:00", tz))
    assert reset_due(late, mode="daily", now=epoch("2026-03-11T03:00:00", tz), tz=tz) is None
    assert reset_due(late, mode="daily", now=epoch("2026-03-11T04:00:00", tz), tz=tz) == "daily"


def test_idle_reset():
    e = _E(1000.0)
    assert reset_due(e, mode="idle", now=1000 + 59 * 60, idle_minutes=60) is None
    assert reset_due(e, mode="idle", now=1000 + 61 * 60, idle_minutes=60) == "idle"
    assert reset_due(e, mode="none", now=1e12) is None


def test_explicit_null_last_active_at_stays_null(tmp_path):
    path = tmp_path / "sessions.json"
    path.write_text(json.dumps({"sessions": {"agent:main:main": {
        "session_id": "s", "updated_at": "2026-01-01T00:00:00.000Z", "last_active_at": None}}}))
    assert read_sessions_file(path, "main", 0)["agent:main:main"].last_active_at is None
