"""The timeline on both storage backends (issue 15 "Timeline on PostgreSQL"): the same
behavioural tests parametrised over embedded (SQLite) and PostgreSQL — ordering, chain,
immutability triggers, tamper detection, archived timelines, concurrency — plus the
byte-identical chain across backends and two "replicas" appending to one session.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys

import pytest
import yaml
from structlog.testing import capture_logs

from runtime.clock import FakeClock
from runtime.storage.postgres.timeline import TRIGGERS as PG_TRIGGERS
from runtime.timeline import TimelineArchivedError, TimelineExistsError, TimelineNotFoundError
from runtime.timeline.model import EVENT_TYPES, GENESIS_HASH, canonical_content
from runtime.timeline.store import SqliteTimelineStore
from tests.helpers import ROOT, base_config
from tests.storage_backends import PostgresBackend, RefusedError

T0 = 1_767_225_600.0
KEY = "agent:main:telegram:dm:42"
TURN = [
    ("USER_INPUT", {"text": "列出 /tmp 里的文件 \"quoted\" \u2028", "message_id": "m1"}),
    ("LLM_RESPONSE", {"text": "Let me look.", "tool_calls": [
        {"id": "c1", "name": "exec", "arguments": {"cmd": "ls /tmp"}}], "usage": {"input": 3}}),
    ("TOOL_CALL", {"id": "c1", "name": "exec", "arguments": {"cmd": "ls /tmp"}}),
    ("TOOL_RESULT", {"tool_call_id": "c1", "result": "a.txt\nb.txt", "is_error": False}),
    ("LLM_RESPONSE", {"text": "Two files: a.txt, b.txt 🎉", "tool_calls": []}),
]


async def _conversation(tl, sid="s1", key=KEY):
    await tl.init_timeline(sid, key)
    for etype, content in TURN:
        await tl.clock.advance(1.5)
        await tl.append_event(sid, etype, content)


async def test_conversation_is_ordered_chained_and_verifies(backend):
    tl = await backend.timeline(FakeClock(T0))
    try:
        await _conversation(tl)
        events = await tl.get_timeline("s1")
        assert [e.seq for e in events] == list(range(1, 7))
        assert [e.event_type for e in events] == ["SESSION_CREATE"] + [t for t, _ in TURN]
        assert events[0].prev_hash == GENESIS_HASH
        assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(events))
        assert events[1].content["text"] == TURN[0][1]["text"]
        report = await tl.verify()
        assert report.ok and report.events_checked == 6 and report.sessions_checked == 1
        assert (await tl.get_info("s1")).event_count == 6
    finally:
        await tl.close()


async def test_chain_is_byte_identical_on_both_backends(tmp_path, pg_dsn):
    """The same events (ids, times, contents) give the same seq, prev_hash and hash."""
    items = [("create", "e1", "SESSION_CREATE", 1000, canonical_content({"session_key": KEY}))]
    items += [("append", f"e{i + 2}", t, 1000 + i * 7 - (5 if i == 2 else 0),
               canonical_content(c)) for i, (t, c) in enumerate(TURN)]
    items.append(("append", "end", "SESSION_END", 9000, canonical_content({"reason": "x"})))
    sqlite_store = await asyncio.to_thread(SqliteTimelineStore.open, tmp_path / "t.db")
    pg = PostgresBackend(pg_dsn)
    try:
        pg_store = (await pg.timeline(FakeClock(T0))).store
        a = await sqlite_store.append_many("s1", items[:3], KEY)
        a += await sqlite_store.append_many("s1", items[3:], KEY)
        b = await pg_store.append_many("s1", items[:3], KEY)
        b += await pg_store.append_many("s1", items[3:], KEY)
        assert [e.to_dict() for e in a] == [e.to_dict() for e in b]
        assert (await sqlite_store.info("s1")) == (await pg_store.info("s1"))
        rows = await pg.raw("SELECT content, hash FROM timeline_events ORDER BY seq")
        assert [r[0] for r in rows] == [i[4] for i in items]  # stored bytes = hashed bytes
    finally:
        await sqlite_store.close()
        await pg.close()


async def test_triggers_refuse_update_delete_and_rewinding(backend):
    tl = await backend.timeline(FakeClock(T0))
    try:
        await _conversation(tl)
        for sql, msg in [
            ("UPDATE timeline_events SET content = '{}' WHERE seq = 2", "UPDATE refused"),
            ("DELETE FROM timeline_events WHERE seq = 6", "DELETE refused"),
            ("DELETE FROM timelines", "timelines are permanent: DELETE refused"),
            ("UPDATE timelines SET last_seq = 1", "head cannot move backwards"),
            ("UPDATE timelines SET session_key = 'agent:main:x'", "identity is permanent"),
        ]:
            with pytest.raises(RefusedError, match=msg):
                await backend.raw(sql)
        if backend.name == "postgres":
            with pytest.raises(RefusedError, match="TRUNCATE refused"):
                await backend.raw("TRUNCATE timeline_events")
        assert (await tl.verify()).ok
        assert len(await tl.get_timeline("s1")) == 6
    finally:
        await tl.close()


async def test_archived_timeline_refuses_appends_and_unarchiving(backend):
    tl = await backend.timeline(FakeClock(T0))
    try:
        await _conversation(tl)
        end = await tl.end_timeline("s1", "reset")
        assert end.seq == 7 and (await tl.get_info("s1")).status == "archived"
        with pytest.raises(TimelineArchivedError):
            await tl.append_event("s1", "USER_INPUT", {"text": "late"})
        with pytest.raises(TimelineExistsError):
            await tl.init_timeline("s1", KEY)
        with pytest.raises(TimelineNotFoundError):
            await tl.append_event("nope", "USER_INPUT", {"text": "x"})
        with pytest.raises(RefusedError, match="cannot un-archive"):
            await backend.raw("UPDATE timelines SET status = 'active'")
        with pytest.raises(RefusedError, match="archived or unknown: INSERT refused"):
            await backend.raw(
                "INSERT INTO timeline_events (event_id, session_id, seq, timestamp, "
                "event_type, content, prev_hash, hash) VALUES "
                f"('x', 's1', 8, 1, 'USER_INPUT', '{{}}', '{end.hash}', 'h')")
        assert (await tl.verify()).ok
    finally:
        await tl.close()


@pytest.mark.parametrize(("sql", "reason", "seq"), [
    (("UPDATE timeline_events SET content = replace(content, 'a.txt', 'c.txt') "
     "WHERE seq = 5"), "hash mismatch", 5),
    ("UPDATE timeline_events SET timestamp = timestamp + 1 WHERE seq = 3",
     "hash mismatch", 3),
    ("DELETE FROM timeline_events WHERE seq = 4",
     "seq gap", 5),
    ("DELETE FROM timeline_events WHERE seq = 6", "timeline head mismatch", 5),
    ("UPDATE timelines SET session_key = 'agent:main:other'", "session_key mismatch", 1),
])
async def test_tampering_with_triggers_off_is_named_by_verify(backend, sql, reason, seq):
    tl = await backend.timeline(FakeClock(T0))
    try:
        await _conversation(tl)
        await _conversation(tl, "s2", "agent:main:telegram:dm:43")
        await backend.tamper(sql.replace("WHERE seq", "WHERE session_id = 's1' AND seq")
                             if "timeline_events" in sql else sql + " WHERE session_id = 's1'")
        report = await tl.verify()
        assert not report.ok
        assert report.reason.startswith(reason.split()[0]) or reason in report.reason, report
        assert report.session_id == "s1" and report.seq == seq
        assert (await tl.verify("s2")).ok  # the other session is untouched
    finally:
        await tl.close()


async def test_100_concurrent_sessions_keep_valid_chains(backend):
    tl = await backend.timeline(FakeClock(T0))
    try:
        async def session(i: int) -> None:
            sid = f"c{i}"
            await tl.init_timeline(sid, f"agent:main:telegram:dm:{i}")
            for j in range(5):
                await tl.append_events(sid, [("USER_INPUT", {"text": f"m{j}"}, None),
                                             ("LLM_RESPONSE", {"text": f"r{j}"}, None)])
        await asyncio.gather(*(session(i) for i in range(100)))
        report = await tl.verify()
        assert report.ok and report.sessions_checked == 100 and report.events_checked == 1100
    finally:
        await tl.close()


async def test_two_replicas_appending_to_one_session_stay_gapless(pg_dsn):
    """Two pools (two gateway processes) interleave appends to the same session: the head
    row lock serialises them, every event lands once, the chain verifies."""
    pg = PostgresBackend(pg_dsn)
    try:
        a, b = await pg.timeline(FakeClock(T0)), await pg.timeline(FakeClock(T0))
        await a.init_timeline("shared", KEY)

        async def writer(tl, tag):
            for i in range(40):
                await tl.append_event("shared", "USER_INPUT", {"text": f"{tag}{i}"})
        await asyncio.gather(writer(a, "a"), writer(b, "b"), writer(a, "c"), writer(b, "d"))
        events = await b.get_timeline("shared")
        assert [e.seq for e in events] == list(range(1, 162))
        assert len({e.content["text"] for e in events[1:]}) == 160
        assert (await a.verify()).ok
        # a create racing on both replicas: exactly one wins
        res = await asyncio.gather(a.init_timeline("race", KEY), b.init_timeline("race", KEY),
                                   return_exceptions=True)
        assert sorted(type(r).__name__ for r in res) == ["TimelineExistsError", "str"]
    finally:
        await pg.close()


async def test_missing_postgres_trigger_is_logged_and_recreated(pg_dsn, capsys):
    pg = PostgresBackend(pg_dsn)
    try:
        tl = await pg.timeline(FakeClock(T0))
        await _conversation(tl)
        await pg.raw("DROP TRIGGER timeline_events_no_update ON timeline_events")
        again = await pg.timeline(FakeClock(T0))
        assert again.store.missing_triggers == ["timeline_events_no_update"]
        with pytest.raises(RefusedError, match="UPDATE refused"):
            await pg.raw("UPDATE timeline_events SET content = '{}'")
        assert (await pg.timeline(FakeClock(T0))).store.missing_triggers == []
    finally:
        await pg.close()


async def test_migration_lists_every_event_type(pg_dsn):
    pg = PostgresBackend(pg_dsn)
    try:
        await pg.timeline(FakeClock(T0))
        (check,) = await pg.raw(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'timeline_events'::regclass AND contype = 'c'")
        assert set(__import__("re").findall(r"'([A-Z_]+)'", check[0])) == set(EVENT_TYPES)
        assert set(PG_TRIGGERS) == {r[0] for r in await pg.raw(
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgrelid IN "
            "('timelines'::regclass, 'timeline_events'::regclass)")}
    finally:
        await pg.close()


def test_timeline_verify_cli_on_postgres(tmp_path, pg_dsn):
    pg = PostgresBackend(pg_dsn)

    async def setup():
        tl = await pg.timeline(FakeClock(T0))
        await _conversation(tl)
        await pg.close()
    asyncio.run(setup())
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(base_config(tmp_path / "state", storage={
        "backend": "postgres", "dsn": pg_dsn})))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "gateway.cli", "--config", str(cfg),
                               "timeline", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
    ok = cli("verify")
    assert ok.returncode == 0, ok.stderr
    assert "OK: 1 session, 6 events verified" in ok.stdout
    listed = cli("list", "--json")
    assert listed.returncode == 0 and "s1" in listed.stdout
    asyncio.run(pg.tamper("UPDATE timeline_events SET content = '{\"text\":\"forged\"}' "
                          "WHERE seq = 2"))
    bad = cli("verify")
    assert bad.returncode == 1 and "BROKEN at session s1 seq 2" in bad.stdout
    assert "hash mismatch" in bad.stdout


async def _until(done, limit: float = 30.0) -> None:
    """Poll an observable (a counter) until it holds; fail after ``limit`` s."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    while not done():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.01)


async def _next_retry(clock: FakeClock, pending: asyncio.Future) -> None:
    """Wait until the retry loop sleeps on ``clock`` (an attempt against a stopped server
    takes real time), then wake it: time never moves while an attempt is in flight."""
    await _until(lambda: pending.done() or clock.pending_sleepers() > 0)
    if not pending.done():
        await clock.advance(clock.next_deadline())


async def test_append_gives_up_after_the_retry_deadline_of_its_clock(pg_dsn, pg_server):
    """The retry deadline is the store's clock's: 20 s of a FakeClock pass without any
    real wait and the append fails (reported, not hung); the chain is unharmed."""
    pg = PostgresBackend(pg_dsn)
    clock = FakeClock(T0)
    try:
        tl = await pg.timeline(clock)
        await _conversation(tl)
        await asyncio.to_thread(pg_server.stop)
        try:
            pending = asyncio.ensure_future(tl.append_event("s1", "USER_INPUT",
                                                            {"text": "lost"}))
            started = clock.monotonic()
            for _ in range(40):
                await _next_retry(clock, pending)
            await _until(pending.done, 10)
            # pauses 0.25, 0.5, 1, then 2 s: 12 fit in the 20 s deadline (the last
            # attempt at 19.75 s would need a pause past it)
            assert tl.store.retry.gave_up == 1 and tl.store.retry.retries == 12
            assert clock.monotonic() - started == 19.75
        finally:
            await asyncio.to_thread(pg_server.start)
        with pytest.raises(Exception, match="timeline write failed"):
            pending.result()
        assert [e.seq for e in await tl.get_timeline("s1")] == list(range(1, 7))
        assert (await tl.verify()).ok
    finally:
        await pg.close()


async def test_append_waits_out_a_short_server_outage(pg_dsn, pg_server):
    """The server restarts under an open pool: an append made meanwhile is committed once
    it is back (retried, not lost, not doubled)."""
    pg = PostgresBackend(pg_dsn)
    clock = FakeClock(T0)  # the retry pauses and deadline run on it: no sleeping here
    try:
        tl = await pg.timeline(clock)
        await _conversation(tl)
        retry = tl.store.retry
        await asyncio.to_thread(pg_server.stop)
        try:
            with capture_logs() as logs:
                pending = asyncio.ensure_future(tl.append_event("s1", "USER_INPUT",
                                                                {"text": "during"}))
                for _ in range(2):  # it met the outage; two more attempts fail
                    await _next_retry(clock, pending)
                await _until(lambda: clock.pending_sleepers() > 0)
            assert retry.retries == 3
            # each retry names the outage itself, not the pool proxy asyncpg detached
            errors = [e["error"] for e in logs
                      if e["event"] == "timeline_database_unreachable"]
            assert len(errors) == 3 and not any("InterfaceError" in e for e in errors)
            assert not pending.done() and retry.outages == 1 and retry.gave_up == 0
        finally:
            await asyncio.to_thread(pg_server.start)
        for _ in range(8):  # 8 more pauses stay inside the deadline: it must get through
            await _next_retry(clock, pending)
            if pending.done():
                break
        ev = await asyncio.wait_for(pending, 30)
        assert ev.seq == 7 and retry.gave_up == 0
        events = await tl.get_timeline("s1")
        assert [e.seq for e in events] == list(range(1, 8))
        assert (await tl.verify()).ok
    finally:
        await pg.close()


async def test_concurrent_sessions_share_transactions_on_postgres(pg_dsn):
    """Group commit: 40 sessions appending a turn 5 times each at once commit in far fewer
    write transactions than calls (each write transaction takes one xid), and every chain
    verifies."""
    pg = PostgresBackend(pg_dsn)
    try:
        tl = await pg.timeline(FakeClock(T0))
        for i in range(40):
            await tl.init_timeline(f"g{i}", f"agent:main:telegram:dm:{i}")
        (before,), = await pg.raw("SELECT txid_current()")

        async def session(i: int) -> None:
            for j in range(5):
                res = await tl.append_events(f"g{i}", [("USER_INPUT", {"text": f"{j}"}, None),
                                                       ("LLM_RESPONSE", {"text": "ok"}, None)])
                assert not any(isinstance(r, BaseException) for r in res), res
        await asyncio.gather(*(session(i) for i in range(40)))
        (after,), = await pg.raw("SELECT txid_current()")
        assert after - before - 1 <= 40, f"{after - before - 1} transactions for 200 calls"
        report = await tl.verify()
        assert report.ok and report.events_checked == 40 * 11
    finally:
        await pg.close()
