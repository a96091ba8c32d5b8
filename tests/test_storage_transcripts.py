"""Transcripts on both storage backends (issue 15 "Transcripts on PostgreSQL"): the same
turns give the same JSONL bytes (``export``), and every reader — the context tail after a
restart, the history window, held heartbeat lines, the display tail — sees the same thing
whether the lines live in a file or in ``transcript_lines``. PostgreSQL only: the table is
append-only (triggers, per-agent partitions) and a second writer cannot fork a session."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from runtime import transcript
from runtime.clock import FakeClock
from runtime.context.messages import assistant_message, user_message
from runtime.context.session_log import HeldLog, SessionLog
from runtime.storage.embedded.transcripts import FileTranscripts
from tests.storage_backends import RefusedError

KEY = "agent:main:cli:dm:alice"
T0 = 1_767_225_600.0


@pytest.fixture
def fixed_ids(monkeypatch):
    """Entry ids from a counter instead of random bits, so two runs of the same turns
    are comparable byte for byte (the id source is not what is under test)."""
    def restart() -> None:
        counter = itertools.count(1)
        monkeypatch.setattr(transcript, "new_entry_id", lambda: f"{next(counter):08x}")
    restart()
    return restart


def _log(store, sid="s1", clock=None, **kw) -> SessionLog:
    clock = clock or FakeClock(T0)
    if isinstance(store, FileTranscripts):
        return SessionLog(store.path("main", sid), session_id=sid, session_key=KEY,
                          clock=clock, cwd="/w", **kw)
    return SessionLog(store.location("main", sid), session_id=sid, session_key=KEY,
                      clock=clock, cwd="/w", writer=store.writer("main", sid, KEY, clock=clock,
                                                                 cwd="/w"),
                      entries=lambda: store.entries_reversed("main", sid), **kw)


async def _turns(store, n=3, sid="s1") -> SessionLog:
    """``n`` user/assistant turns, each batched like a real turn (input flushed first)."""
    log = _log(store, sid)
    for i in range(n):
        log.begin_batch()
        log.append_message(user_message(f"question {i} ünïcode", int((T0 + i) * 1000)))
        log.flush_batch()
        log.append_message(assistant_message(f"answer {i}", [], int((T0 + i) * 1000 + 500)))
        log.flush_batch(end=True)
    await store.settled(sid)
    return log


async def test_same_turns_export_the_same_bytes_as_a_jsonl_file(backend, tmp_path, fixed_ids):
    store = await backend.transcripts(FakeClock(T0))
    await _turns(store)
    exported = await asyncio.to_thread(store.export, "main", "s1")
    # the reference: the very same turns written by the single-host file backend
    reference = FileTranscripts(tmp_path / "reference")
    fixed_ids()
    await _turns(reference)
    expected = reference.path("main", "s1").read_bytes()
    assert exported == expected
    assert expected.count(b"\n") == 7 and expected.startswith(b'{"type":"session"')
    assert store.header("main", "s1")["session_key"] == KEY
    assert store.export("main", "nope") is None


async def test_context_tail_is_reloaded_after_a_restart(backend):
    store = await backend.transcripts(FakeClock(T0))
    first = await _turns(store, n=5)
    before = [(m.role, m.content) for m in first.messages()]
    restarted = await backend.transcripts(FakeClock(T0))  # a new process
    again = _log(restarted)
    assert [(m.role, m.content) for m in again.messages()] == before
    again.append_message(user_message("after restart", int(T0 * 1000) + 9000))
    await restarted.settled("s1")
    entries = [e for e, _ in store.entries_reversed("main", "s1")]
    assert entries[0]["message"]["content"][0]["text"] == "after restart"
    assert entries[0]["parentId"] == entries[1]["id"]  # the chain continues across processes


async def test_history_window_and_compaction_read_the_same(backend):
    store = await backend.transcripts(FakeClock(T0))
    log = await _turns(store, n=6)
    log.apply_compaction("they talked", keep_from=8, tokens_before=100)
    log.flush_batch()
    await store.settled("s1")
    again = _log(store)
    msgs = again.messages()
    assert msgs[0].content.endswith("they talked") and len(msgs) == 5
    window = again.context(budget_tokens=10_000, max_user_turns=1)
    assert [m.content for m in window][-2:] == ["question 5 ünïcode", "answer 5"]


async def test_held_heartbeat_lines_discarded_leave_the_transcript_untouched(backend):
    store = await backend.transcripts(FakeClock(T0))
    log = await _turns(store, n=1)
    before = store.export("main", "s1")
    held = HeldLog(log)
    held.append_message(user_message("heartbeat", int(T0 * 1000) + 1))
    held.append_message(assistant_message("HEARTBEAT_OK", [], int(T0 * 1000) + 2))
    assert held.discard() == 2
    await store.settled("s1")
    assert store.export("main", "s1") == before
    kept = HeldLog(log)
    kept.append_message(user_message("heartbeat", int(T0 * 1000) + 3))
    kept.append_message(assistant_message("something to say", [], int(T0 * 1000) + 4))
    kept.commit()
    await store.settled("s1")
    tail = store.tail("main", "s1", 64 * 1024)
    assert [e["message"]["content"][0]["text"] for e in tail.entries][-2:] == [
        "heartbeat", "something to say"]
    assert tail.header["id"] == "s1" and tail.complete


async def test_tail_reads_only_the_newest_bytes(backend):
    store = await backend.transcripts(FakeClock(T0))
    await _turns(store, n=40)
    tail = store.tail("main", "s1", 2048)
    assert not tail.complete and tail.header is None
    texts = [e["message"]["content"][0]["text"] for e in tail.entries]
    assert texts[-1] == "answer 39" and 4 <= len(texts) < 30
    assert sum(len(transcript._dumps(e)) for e in tail.entries) <= 2048 + 200


async def test_postgres_transcript_lines_are_append_only(pg_dsn):
    from tests.storage_backends import PostgresBackend
    pg = PostgresBackend(pg_dsn)
    try:
        store = await pg.transcripts(FakeClock(T0))
        await _turns(store, n=1)
        part = (await pg.raw("SELECT transcript_partition('main')"))[0][0]
        for sql in ("UPDATE transcript_lines SET line = '{}'", "DELETE FROM transcript_lines",
                    "TRUNCATE transcript_lines", f"UPDATE {part} SET line = '{{}}'",
                    f"DELETE FROM {part}", f"TRUNCATE {part}"):
            with pytest.raises(RefusedError, match="append-only"):
                await pg.raw(sql)
        assert (await pg.raw("SELECT count(*) FROM transcript_lines"))[0][0] == 3
        parts = await pg.raw("SELECT count(*) FROM pg_inherits WHERE inhparent = "
                             "'transcript_lines'::regclass")
        assert parts[0][0] == 1
    finally:
        await pg.close()


async def test_postgres_second_writer_cannot_fork_a_session(pg_dsn):
    """Two processes append to one session (a lane that moved without the old holder
    noticing): the stale writer's lines are refused by the primary key, it is marked
    stale, and the transcript stays one chain."""
    from tests.storage_backends import PostgresBackend
    pg = PostgresBackend(pg_dsn)
    try:
        a = await pg.transcripts(FakeClock(T0))
        b = await pg.transcripts(FakeClock(T0))
        log_a = await _turns(a, n=1)
        log_b = _log(b)
        log_b.messages()  # b loads the session as it is now
        log_a.append_message(user_message("from a", int(T0 * 1000) + 10))
        await a.settled("s1")
        log_b.append_message(user_message("from b (stale)", int(T0 * 1000) + 11))
        await b.settled("s1")
        assert b.conflicts == 1 and log_b.writer.stale
        texts = [e["message"]["content"][0]["text"] for e, _ in a.entries_reversed("main", "s1")]
        assert texts[0] == "from a" and "from b (stale)" not in texts
        with pytest.raises(OSError, match="earlier write failed"):
            log_b.append_message(user_message("again", int(T0 * 1000) + 12))
    finally:
        await pg.close()
