"""The intake journal file (gateway/journal/store.py): entries survive reopening, torn
lines are skipped and reported, and compaction keeps the cost per message flat."""

from __future__ import annotations

import asyncio
import json

from gateway.journal.resume import resume_action
from gateway.journal.store import IntakeJournal
from runtime.clock import SYSTEM_CLOCK


def journal(path, **kw) -> IntakeJournal:
    j = IntakeJournal(path, SYSTEM_CLOCK, **kw)
    j.load()
    return j


def test_unfinished_entries_survive_reopen_with_their_marks(tmp_path):
    path = tmp_path / "j.jsonl"
    j = journal(path)
    a = j.accept("agent:main:telegram:dm:1", {"text": "a"}, "telegram:default:1:1")
    b = j.accept("agent:main:telegram:dm:1", {"text": "b"})
    c = j.accept("agent:main:slack:dm:u1", {"text": "c"})
    d = j.accept("agent:main:slack:dm:u1", {"text": "d"})
    j.started([a.id], "run1")
    j.tool_began("run1", "write")
    j.started([c.id], "run2")
    j.replying([c.id])
    j.done(b.id)
    j.close()
    again = IntakeJournal(path, SYSTEM_CLOCK)
    left = {e.work["text"]: e for e in again.load()}
    assert set(left) == {"a", "c", "d"}
    assert (left["a"].started, left["a"].tools, left["a"].dedupe) == (
        True, ["write"], "telegram:default:1:1")
    assert [resume_action(left[k]) for k in "acd"] == ["continue", "reply", "run"]
    assert d.id in {e.id for e in again.unfinished()}
    again.close()


def test_torn_last_line_is_skipped_and_logged(tmp_path, capsys):
    path = tmp_path / "j.jsonl"
    j = journal(path)
    j.accept("agent:main:telegram:dm:1", {"text": "kept"})
    j.close()
    with open(path, "ab") as fh:
        fh.write(b'{"op":"accept","id":"x","session_key":"agent:ma')  # kill -9 mid-write
    again = IntakeJournal(path, SYSTEM_CLOCK)
    assert [e.work["text"] for e in again.load()] == ["kept"]
    again.accept("agent:main:telegram:dm:1", {"text": "next"})
    again.close()
    lines = path.read_bytes().splitlines()
    assert all(json.loads(line) for line in lines)  # the next append is on a fresh line
    err = capsys.readouterr()
    assert "journal_lines_skipped" in err.out + err.err


def test_durable_shares_one_fsync_between_concurrent_callers(tmp_path, monkeypatch):
    import os
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    j = journal(tmp_path / "j.jsonl")
    calls.clear()

    async def accept(i: int) -> None:
        j.accept("agent:main:cli:dm:x", {"text": str(i)})
        await j.durable()

    async def main() -> None:
        await asyncio.gather(*(accept(i) for i in range(20)))

    asyncio.run(main())
    assert 1 <= len(calls) <= 3  # group commit, not 20 fsyncs
    j.close()


def test_compaction_keeps_the_cost_per_message_flat_over_20k_messages(tmp_path):
    """Sized for the suite (the 100k-message figure is bench/journal_bench.py's)."""
    path = tmp_path / "j.jsonl"
    j = journal(path, fsync=False, compact_after=500)
    stuck = [j.accept("agent:main:slack:dm:u9", {"text": f"stuck {i}"}) for i in range(5)]
    per_block, sizes = [], []
    for block in range(5):
        before = j.bytes_written
        for i in range(4_000):
            e = j.accept("agent:main:telegram:dm:1", {"text": f"m{block}-{i}", "channel": "t"})
            j.started([e.id], f"r{block}-{i}")
            j.done(e.id)
            if i % 250 == 0:
                sizes.append(path.stat().st_size)
        per_block.append(j.bytes_written - before)
    # bytes written per 4k messages (appends + compactions) do not grow with the history
    assert max(per_block) <= 1.1 * min(per_block)
    # the file stays bounded by the compaction threshold, not by the messages seen
    assert max(sizes) < 500 * 200 * 2
    assert j.stats()["compactions"] >= 80
    j.close()
    again = IntakeJournal(path, SYSTEM_CLOCK)
    assert [e.id for e in again.load()] == [e.id for e in stuck]  # live entries kept
    again.close()


async def test_an_unreadable_journal_disables_only_itself(tmp_path):
    from tests.helpers import base_config, running_gateway
    state = tmp_path / "state"
    state.mkdir()
    (state / "intake-journal.jsonl").mkdir()  # not a file: cannot be read or replaced
    async with running_gateway(base_config(state)) as gw:
        assert any("intake journal" in p for p in gw.status()["problems"])
        assert gw.intake.journal is None
        result = await gw.local.send("still works")
        assert result.status == "ok"


def test_each_garbage_line_is_logged_with_its_session_key(tmp_path):
    from structlog.testing import capture_logs
    path = tmp_path / "j.jsonl"
    j = journal(path)
    kept = j.accept("agent:main:slack:dm:u7", {"text": "kept"})
    j.close()
    with open(path, "ab") as fh:
        fh.write(b'{"op":"start","id":"' + kept.id.encode() + b'","run_id":"r1","ts":1\xff\n')
        fh.write(b"not json at all\n")
        fh.write(b'{"op":"accept","id":"y","session_key":"agent:main:telegram:dm:42","wo')
    with capture_logs() as logs:
        IntakeJournal(path, SYSTEM_CLOCK).load()
    lines = {e["line"]: e for e in logs if e["event"] == "journal_line_skipped"}
    assert lines[2]["session_key"] == "agent:main:slack:dm:u7"  # known by its entry id
    assert lines[2]["op"] == "start" and lines[2]["entry_id"] == kept.id
    assert lines[3]["session_key"] == "unknown"
    assert lines[4]["session_key"] == "agent:main:telegram:dm:42"  # read from the torn line
    assert [e["count"] for e in logs if e["event"] == "journal_lines_skipped"] == [3]
