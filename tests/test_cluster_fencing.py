"""Lease fencing on a real PostgreSQL (issue 15 "Replicas"; gateway/cluster/fencing.py): a
replica that lost its account or lane lease while it was paused (its heartbeat older than
the TTL) and another replica took over cannot write as the owner any more — not the
Telegram offset, not the reply mark, not the done mark, not the intake fast path — even
when the lease later comes back to it (the generation is new). The end-to-end version
with a real SIGSTOP/SIGCONT is in test_cluster_replicas.py."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from gateway.cluster import membership
from gateway.cluster.accounts import OffsetStore
from gateway.cluster.fencing import LeaseLost
from gateway.cluster.work import ClusterWork
from gateway.turns.work import UserWork
from tests import cluster_harness

TTL = 3.0
LEASE = "account:telegram:bot0"
KEY = "agent:main:telegram:dm:1"

dbs = cluster_harness.replica_dbs  # fixture
_pause, pg_query = cluster_harness.pause, cluster_harness.pg_query


async def test_offset_of_a_replica_that_lost_the_account_is_refused(dbs, pg_dsn):
    r1, r2 = dbs["r1"], dbs["r2"]
    holder, gen1 = await r1.run(lambda c: membership.acquire_fenced(c, LEASE, "r1", TTL))
    assert holder == "r1"
    old = OffsetStore(r1, "telegram:bot0:offset", replica="r1", lease=LEASE, generation=gen1)
    await old.save(5)
    await _pause(r1, "r1")
    holder, gen2 = await r2.run(lambda c: membership.acquire_fenced(c, LEASE, "r2", TTL))
    assert holder == "r2" and gen2 != gen1
    new = OffsetStore(r2, "telegram:bot0:offset", replica="r2", lease=LEASE, generation=gen2)
    await new.save(10)
    await old.save(7)  # r1 resumes with its stale offset
    assert old.fenced == 1 and new.fenced == 0
    assert await pg_query(pg_dsn, "SELECT value::text, written_by FROM cluster_channel_state") == [
        ("10", "r2")]
    # r2 dies, r1 (alive again) takes the account back: a NEW generation; a save made
    # under the old one is still refused, the new owner's goes through
    await r1.run(lambda c: membership.beat(c, "r1", None))
    await _pause(r2, "r2")
    holder, gen3 = await r1.run(lambda c: membership.acquire_fenced(c, LEASE, "r1", TTL))
    assert holder == "r1" and gen3 not in (gen1, gen2)
    await old.save(8)
    assert old.fenced == 2
    await OffsetStore(r1, "telegram:bot0:offset", replica="r1", lease=LEASE,
                      generation=gen3).save(11)
    assert await pg_query(pg_dsn, "SELECT value::text, written_by FROM cluster_channel_state") == [
        ("11", "r1")]
    # re-taking a lease one already holds keeps its generation
    assert (await r1.run(lambda c: membership.acquire_fenced(c, LEASE, "r1", TTL))) == (
        "r1", gen3)


def _work(journal_id: int) -> UserWork:
    return UserWork(agent_id="main", text="hi", channel="telegram", account_id="bot0",
                    chat_type="dm", sender_id="1", journal_id=str(journal_id) if journal_id else None)


async def test_reply_and_done_marks_of_a_taken_over_turn_are_refused(dbs, pg_dsn):
    r1, r2 = dbs["r1"], dbs["r2"]
    w1 = ClusterWork(r1, "r1", TTL, None, side_effecting=lambda t: False,
                     debounce=lambda *a: 0)
    w2 = ClusterWork(r2, "r2", TTL, None, side_effecting=lambda t: False,
                     debounce=lambda *a: 0)
    gone: list[str] = []
    w1.on_lane_gone = gone.append
    key = "agent:main:telegram:dm:1"
    assert await w1.accept(key, _work(0), "tg:1") is True
    row = int((await pg_query(pg_dsn, "SELECT id FROM cluster_work"))[0][0])
    assert await r1.run(lambda c: w1._assign(c, key, [row])) == "r1"  # running on r1
    w1.held[key] = 0.0
    await _pause(r1, "r1")
    assert await w2.take_over() == 1  # r2 requeues the row to itself (lane lease too)
    assert await pg_query(pg_dsn, "SELECT target, state, replying FROM cluster_work") == [
        ("r2", "queued", False)]
    with pytest.raises(LeaseLost):
        await w1.reply_sending([_work(row)], "the stale answer", None)
    w1.finished([_work(row)])
    await asyncio.wait_for(w1.close(), 10)
    assert w1.fenced == 1
    assert await pg_query(pg_dsn, "SELECT target, state, replying FROM cluster_work") == [
        ("r2", "queued", False)]  # untouched by r1
    # r1 still believes it runs the lane: its fast path is refused, the row takes the
    # lease path, the lane and its cached transcript are forgotten
    fresh = _work(0)
    assert await w1.accept(key, fresh, "tg:2") is True
    assert int(fresh.journal_id) not in w1._fast and key not in w1.held and gone == [key]
    assert await pg_query(pg_dsn, f"SELECT state FROM cluster_work WHERE id = "
                            f"{fresh.journal_id}") == [("accepted",)]
    # the owner's own marks go through
    await r2.run(lambda c: w2._assign(c, key, [row]))
    await w2.reply_sending([_work(row)], "the answer", None)
    assert await pg_query(pg_dsn, f"SELECT replying FROM cluster_work WHERE id = {row}") == [
        (True,)]


async def test_a_turn_queued_before_a_pause_does_not_start_on_rows_taken_over(dbs, pg_dsn):
    """Seen with bench/cluster_checker.py (seed 302, ``overlapping-calls``): a turn that
    was queued on r1's own lane before r1 was paused starts after SIGCONT, though r2 took
    its row over meanwhile and runs it. Its started mark is refused, and the turn ends
    there (``Forwarded``) instead of calling the model beside r2's turn of the session."""
    from gateway.cluster.work import Forwarded
    r1, r2 = dbs["r1"], dbs["r2"]
    kw = {"side_effecting": lambda t: False, "debounce": lambda *a: 0}
    w1, w2 = ClusterWork(r1, "r1", TTL, None, **kw), ClusterWork(r2, "r2", TTL, None, **kw)
    assert await w1.accept(KEY, _work(0), "tg:1") and await w1.accept(KEY, _work(0), "tg:2")
    one, two = [int(r[0]) for r in await pg_query(pg_dsn, "SELECT id FROM cluster_work "
                                                          "ORDER BY id")]
    assert await r1.run(lambda c: w1._assign(c, KEY, [one, two])) == "r1"
    assert await w1.turn_started("run-1", [_work(one)]) is None  # r1's turn of row one
    await _pause(r1, "r1")
    assert await w2.take_over() == 2  # both rows requeued to r2
    got = await asyncio.wait_for(w1.turn_started("run-2", [_work(two)]), 10)
    assert isinstance(got, Forwarded) and w1.fenced == 1
    assert await pg_query(pg_dsn, "SELECT id, target, started FROM cluster_work ORDER BY "
                                  "id") == [(one, "r2", True), (two, "r2", False)]
    await asyncio.wait_for(w1.close(), 10)


async def _lane_of_r1(conn: asyncpg.Connection) -> tuple[str, str, int]:
    """Heartbeats of r1 and r2; r1 takes KEY's lane: its fence."""
    for r in ("r1", "r2"):
        await membership.beat(conn, r, None)
    _, generation = await membership.acquire_fenced(conn, "lane:" + KEY, "r1", TTL)
    return "lane:" + KEY, "r1", generation


async def test_timeline_and_session_rows_of_a_stale_lane_generation_are_refused(pg_dsn):
    """The stores themselves (runtime/storage/postgres/fence.py): an append or a session
    row under the old lane generation is refused in its own statement, nothing of it is
    written, and the chain and the row stay the new owner's."""
    from runtime.clock import FakeClock
    from runtime.storage.postgres.fence import TimelineFencedError
    from runtime.storage.postgres.sessions import PgSessionRecords
    from tests.storage_backends import PostgresBackend
    backend = PostgresBackend(pg_dsn)
    try:
        tl = await backend.timeline(FakeClock())
        conn = await asyncpg.connect(pg_dsn)
        try:
            stale = await _lane_of_r1(conn)
            lane = stale[0]
            await tl.init_timeline("s1", KEY)
            assert not any(isinstance(r, Exception) for r in await tl.append_events(
                "s1", [("USER_INPUT", {"text": "one"}, None)], fence=stale))
            records = PgSessionRecords(await backend.bridge(), "main")
            row = {"session_id": "s1", "n": 1}
            assert records.write_fenced({KEY: row}, [], {KEY: stale}) == []
            await cluster_harness.age(conn, "r1")  # r1 paused past the TTL ...
            _, new = await membership.acquire_fenced(conn, lane, "r2", TTL)  # ... taken over
            fresh = (lane, "r2", new)
            assert all(isinstance(r, TimelineFencedError) for r in await tl.append_events(
                "s1", [("USER_INPUT", {"text": "stale"}, None),
                       ("LLM_RESPONSE", {"text": "stale answer"}, None)], fence=stale))
            assert not any(isinstance(r, Exception) for r in await tl.append_events(
                "s1", [("USER_INPUT", {"text": "two"}, None)], fence=fresh))
            assert records.write_fenced({KEY: {"session_id": "s1", "n": 2}}, [],
                                        {KEY: fresh}) == []
            assert records.write_fenced({KEY: {"session_id": "s1", "n": 9}}, [],
                                        {KEY: stale}) == [KEY]
        finally:
            await conn.close()
        events = await tl.get_timeline("s1")
        assert [e.content.get("text") for e in events[1:]] == ["one", "two"]
        assert (await tl.verify("s1")).ok
        assert await pg_query(pg_dsn, "SELECT entry->>'n', written_by FROM sessions") == [
            ("2", "r2")]
    finally:
        await backend.close()


async def test_transcript_lines_of_a_stale_lane_generation_are_refused(pg_dsn):
    """Lines a paused replica flushes after a takeover are refused by the lane fence even
    where no line of the new owner collides with them yet (the primary key would not)."""
    from runtime.clock import FakeClock
    from tests.storage_backends import PostgresBackend
    backend = PostgresBackend(pg_dsn)
    try:
        store = await backend.transcripts(FakeClock())
        conn = await asyncpg.connect(pg_dsn)
        try:
            fences = {"now": await _lane_of_r1(conn)}
            lane = fences["now"][0]
            store.fence = lambda key: fences["now"] if key == KEY else None
            w = await asyncio.to_thread(
                lambda: store.writer("main", "s1", KEY, clock=FakeClock()).open())
            w.append_message({"role": "user", "content": "one", "timestamp": 0})
            await w.settled()
            await cluster_harness.age(conn, "r1")
            await membership.acquire_fenced(conn, lane, "r2", TTL)  # taken over
            w.append_message({"role": "assistant", "content": "stale", "timestamp": 0})
            await w.settled()
        finally:
            await conn.close()
        assert w.stale
        rows = await pg_query(pg_dsn, "SELECT seq, line::json->'message'->>'content' FROM "
                                      "transcript_lines ORDER BY seq")
        assert rows == [(0, None), (1, "one")]
    finally:
        await backend.close()


async def _lane_on_r1(dbs, pg_dsn, clock) -> tuple[ClusterWork, ClusterWork, int]:
    """r1 (its cluster clock ``clock``, heartbeat just sent) runs KEY's lane with one
    row; r2 is alive beside it."""
    r1, r2 = dbs["r1"], dbs["r2"]
    r1.clock = clock
    kw = {"side_effecting": lambda t: False, "debounce": lambda *a: 0}
    w1, w2 = ClusterWork(r1, "r1", TTL, None, **kw), ClusterWork(r2, "r2", TTL, None, **kw)
    assert await w1.accept(KEY, _work(0), "tg:1")
    [(row,)] = await pg_query(pg_dsn, "SELECT id FROM cluster_work")
    assert await r1.run(lambda c: w1._assign(c, KEY, [int(row)])) == "r1"
    w1.held[KEY] = 0.0
    w1.beat_ok(clock.monotonic())
    return w1, w2, int(row)


async def test_a_lane_taken_over_during_a_pause_is_seen_before_the_next_model_round(
        dbs, pg_dsn):
    """``runs_lane`` (asked before each model round, TurnInput ``lane_held``): while the
    heartbeat is fresh it answers True without a query; after a pause longer than the
    beats allow (the cluster clock moved on) it asks the lease row, and once another
    replica took the lane over it is False and the lane is forgotten here. Before, a turn
    past its started mark made one more model call after SIGCONT."""
    from runtime.clock import FakeClock
    clock = FakeClock()
    w1, w2, _row = await _lane_on_r1(dbs, pg_dsn, clock)
    assert w1.runs_lane(KEY) is True  # a plain bool: no database round trip
    await clock.advance(TTL)  # SIGSTOP ... (no beat got through meanwhile)
    still = w1.runs_lane(KEY)
    assert still is not True and await still is True  # paused, but nobody took it
    await _pause(dbs["r1"], "r1")
    assert await w2.take_over() == 1  # r2 took the lane and the row
    await clock.advance(1.0)  # ... SIGCONT: the turn's next round asks before the beat loop ran
    assert await w1.runs_lane(KEY) is False
    assert KEY not in w1.held and not w1.fences.holds(KEY)
    # the beat loop comes back: a beat after the gap does not vouch for the lost lane
    w1.beat_ok(clock.monotonic())
    assert w1.runs_lane(KEY) is False
    assert w1.runs_lane("agent:main:telegram:dm:other") is True  # no lane taken here
    await asyncio.wait_for(w1.close(), 10)


async def test_a_beat_after_a_gap_makes_the_held_lanes_checked_once(dbs, pg_dsn):
    """The beat loop ran before the turn after SIGCONT: its beat is fresh, but the gap
    before it means the lane may have moved meanwhile: checked once against the lease,
    then (still this replica's) answered locally again."""
    from runtime.clock import FakeClock
    clock = FakeClock()
    w1, _w2, _row = await _lane_on_r1(dbs, pg_dsn, clock)
    await clock.advance(TTL)
    w1.beat_ok(clock.monotonic())
    checked = w1.runs_lane(KEY)
    assert checked is not True and await checked is True
    assert w1.runs_lane(KEY) is True
    await asyncio.wait_for(w1.close(), 10)


async def test_a_turn_whose_lane_was_taken_over_makes_no_further_model_call(
        dbs, pg_dsn, tmp_path, model, tg):
    """The turn side (runtime/turn/runner.py, gateway/turns/executor.py): a real turn asks
    before each model round. r1 is paused during its first round (a tool call), r2 takes
    the lane over meanwhile; the second round's check says the lane moved and the turn
    ends there: one model call, nothing sent, no outcome recorded here (r2 answers)."""
    import inspect

    from runtime.clock import FakeClock
    from tests.channel_harness import chat_requests, until
    from tests.helpers import base_config, running_gateway
    clock = FakeClock()
    w1, w2, _row = await _lane_on_r1(dbs, pg_dsn, clock)
    asked: list[str] = []

    async def lane_held(key: str) -> bool:
        asked.append(key)
        if len(asked) == 2:  # r1 was stopped during round 1, past the TTL; r2 took over
            await _pause(dbs["r1"], "r1")
            assert await w2.take_over() == 1
            await clock.advance(TTL)
        got = w1.runs_lane(key)
        return await got if inspect.isawaitable(got) else got

    cfg = base_config(tmp_path / "state", model.base_url, channels={"telegram": {
        "enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
        "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}})
    model.script_tool_call("read", {"path": "nothing-here.md"})
    model.script_text("the stale answer")
    async with running_gateway(cfg) as gw:
        gw.executor.lane_held = lane_held
        tg.inject_message("hi", chat_id=1, user_id=1)
        await until(lambda: len(asked) == 2, what="the second round's check")
        await until(lambda: not gw.lanes.is_busy(KEY), what="the turn's end")
        assert asked == [KEY, KEY] and len(chat_requests(model)) == 1
        assert tg.bot_messages(1) == [] and gw.outcomes.counts == {}
    await asyncio.wait_for(w1.close(), 10)
