"""Taking over a dead replica's turns on a real PostgreSQL (issue 15 "Replicas": every
single-host guarantee holds cluster-wide; gateway/cluster/work.py ``claim``): a turn whose
side-effecting tool had begun on the dead replica is resumed as a restart on one host
resumes it (README "Delivery guarantees": ``continue``, not a blind re-run)."""

from __future__ import annotations

import asyncio

from gateway.cluster.work import ClusterWork
from gateway.turns.work import UserWork
from runtime.lanes import LaneManager
from tests import cluster_harness

TTL = 3.0
KEY = "agent:main:telegram:dm:1"

dbs = cluster_harness.replica_dbs  # fixture
pg_query, until = cluster_harness.pg_query, cluster_harness.until


def _work() -> UserWork:
    return UserWork(agent_id="main", text="hi", channel="telegram", account_id="bot0",
                    chat_type="dm", sender_id="1", message_id="42")


async def _taken_over(dbs, pg_dsn, tools: str) -> tuple[list, list]:
    """r1 runs a turn (started, with ``tools`` marked), dies; r2 takes it over and runs
    it on its lanes. Returns (resume value of each turn r2 ran, on_interrupted calls)."""
    r1, r2 = dbs["r1"], dbs["r2"]
    ran: list = []

    async def runner(key, works, control):
        ran.extend(w.resume for w in works)

    lanes = LaneManager(runner, mode="followup", debounce=0)
    w1 = ClusterWork(r1, "r1", TTL, None, side_effecting=lambda t: t == "exec",
                     debounce=lambda *a: 0)
    w2 = ClusterWork(r2, "r2", TTL, lanes, side_effecting=lambda t: t == "exec",
                     debounce=lambda *a: 0)
    calls: list = []

    async def interrupted(key, work, names):
        calls.append((key, work.message_id, names))
    w2.on_interrupted = interrupted
    work = _work()
    assert await w1.accept(KEY, work, "tg:1")
    row = int(work.journal_id)
    assert await r1.run(lambda c: w1._assign(c, KEY, [row])) == "r1"
    # the marks r1's JournalTracker wrote before it died: the turn began, tools started
    await pg_query(pg_dsn, "UPDATE cluster_work SET started = true, tools = $2::text[] "
                   "WHERE id = $1", row, tools.split())
    await cluster_harness.pause(r1, "r1")
    assert await w2.take_over() == 1
    assert await w2.claim() == 1
    await until(lambda: ran, what="the taken-over turn")
    await asyncio.wait_for(w1.close(), 10)
    await asyncio.wait_for(w2.close(), 10)
    lanes.close()
    return ran, calls


async def test_a_taken_over_turn_whose_side_effecting_tool_began_continues(dbs, pg_dsn):
    """It used to be re-run blindly (``rerun``: the recorded tools were never read), so
    the model, seeing no result, could run the exec or message a second time."""
    ran, calls = await _taken_over(dbs, pg_dsn, "exec")
    assert ran == ["continue"]
    assert calls == [(KEY, "42", ["exec"])]


async def test_a_taken_over_turn_without_side_effecting_tools_is_run_again(dbs, pg_dsn):
    ran, calls = await _taken_over(dbs, pg_dsn, "")
    assert ran == ["rerun"] and calls == []


async def _reply_cut(dbs, stream: bool) -> list:
    """r1 begins delivering a reply (the real reply_sending mark) for a batch of two
    merged messages, then dies; r2 takes the rows over. Returns on_reply_cut's calls."""
    r1, r2 = dbs["r1"], dbs["r2"]
    w1 = ClusterWork(r1, "r1", TTL, None, side_effecting=lambda t: False,
                     debounce=lambda *a: 0)
    w2 = ClusterWork(r2, "r2", TTL, None, side_effecting=lambda t: False,
                     debounce=lambda *a: 0)
    calls: list = []

    async def cut(key, work, reply, row):
        calls.append((key, work.message_id, reply["text"], reply["stream"], reply["key"]))
    w2.on_reply_cut = cut
    first, second = _work(), _work()
    assert await w1.accept(KEY, first, "tg:1") and await w1.accept(KEY, second, "tg:2")
    rows = [int(first.journal_id), int(second.journal_id)]
    assert await r1.run(lambda c: w1._assign(c, KEY, rows)) == "r1"
    await w1.reply_sending([first, second], "the answer", first.journal_id, stream=stream)
    await cluster_harness.pause(r1, "r1")
    assert await w2.take_over() == 2
    await asyncio.wait_for(w1.close(), 10)
    await asyncio.wait_for(w2.close(), 10)
    return calls


async def test_a_taken_over_streamed_reply_is_resolved_once_not_dropped(dbs, pg_dsn):
    """The reply had begun on the dead replica (a Telegram draft, Discord/Slack message
    pieces): the rows were marked done and nothing else happened, so the user was left
    with a draft and no answer or notice. Now the taking replica gets the reply once per
    batch to resolve it (cut-off notice for a stream, unknown-outcome resend otherwise)."""
    calls = await _reply_cut(dbs, stream=True)
    first = calls[0][4]
    assert calls == [(KEY, "42", "the answer", True, first)]
    assert await pg_query(pg_dsn, "SELECT count(*) FROM cluster_work WHERE state = "
                          "'done'") == [(2,)]  # never run again


async def test_a_taken_over_plain_reply_carries_its_text_for_the_resend(dbs, pg_dsn):
    calls = await _reply_cut(dbs, stream=False)
    assert [c[2:4] for c in calls] == [("the answer", False)]


async def test_a_message_routed_after_its_owner_died_runs_after_the_interrupted_turn(dbs,
                                                                                     pg_dsn):
    """r1 runs the turn of message 42 and dies; message 43 reaches r2 (the account's new
    owner) before any takeover tick. Routing 43 took r1's lane and ran it at once, and 42,
    taken over afterwards, ran behind it on a transcript already ending with 43 (answered
    twice, 42 never). Now routing hands 42 over first: the lane runs 42, then 43."""
    r1, r2 = dbs["r1"], dbs["r2"]
    ran: list = []

    async def runner(key, works, control):
        ran.extend((w.message_id, w.resume) for w in works)

    lanes = LaneManager(runner, mode="followup", debounce=0)
    kw = {"side_effecting": lambda t: t == "exec", "debounce": lambda *a: 0}
    w1, w2 = ClusterWork(r1, "r1", TTL, None, **kw), ClusterWork(r2, "r2", TTL, lanes, **kw)
    first, second = _work(), _work()
    second.message_id = "43"
    assert await w1.accept(KEY, first, "tg:1")
    assert await r1.run(lambda c: w1._assign(c, KEY, [int(first.journal_id)])) == "r1"
    await pg_query(pg_dsn, "UPDATE cluster_work SET started = true WHERE id = $1",
                   int(first.journal_id))
    await cluster_harness.pause(r1, "r1")
    assert await w2.accept(KEY, second, "tg:2")
    done = w2.submit(KEY, second, {"idle_debounce": 0})
    w2.watch(second, done)
    await asyncio.wait_for(done, 10)
    await until(lambda: len(ran) == 2, what="both turns")
    assert ran == [("42", "rerun"), ("43", None)]
    assert w2.taken_over == 1
    await asyncio.wait_for(w1.close(), 10)
    await asyncio.wait_for(w2.close(), 10)
    lanes.close()


async def test_a_message_routed_after_a_takeover_tick_runs_after_the_requeued_turn(dbs,
                                                                                   pg_dsn):
    """r1 runs the turn of message 42 and dies; r2's takeover tick requeues 42 for r2 (it
    took the lane), and message 43 is routed on r2 before r2 claims 42. 43 used to run at
    once and 42 after it, on a transcript already ending with 43; now routing starts the
    older row queued here first (and the claim finds nothing left to run)."""
    r1, r2 = dbs["r1"], dbs["r2"]
    ran: list = []

    async def runner(key, works, control):
        ran.extend((w.message_id, w.resume) for w in works)

    lanes = LaneManager(runner, mode="followup", debounce=0)
    kw = {"side_effecting": lambda t: t == "exec", "debounce": lambda *a: 0}
    w1, w2 = ClusterWork(r1, "r1", TTL, None, **kw), ClusterWork(r2, "r2", TTL, lanes, **kw)
    first, second = _work(), _work()
    second.message_id = "43"
    assert await w1.accept(KEY, first, "tg:1")
    assert await r1.run(lambda c: w1._assign(c, KEY, [int(first.journal_id)])) == "r1"
    await pg_query(pg_dsn, "UPDATE cluster_work SET started = true WHERE id = $1",
                   int(first.journal_id))
    await cluster_harness.pause(r1, "r1")
    assert await w2.take_over() == 1  # queued for r2, not claimed yet
    assert await w2.accept(KEY, second, "tg:2")
    done = w2.submit(KEY, second, {"idle_debounce": 0})
    w2.watch(second, done)
    await asyncio.wait_for(done, 10)
    await w2.claim()
    await until(lambda: len(ran) == 2, what="both turns")
    assert ran == [("42", "rerun"), ("43", None)]
    await asyncio.wait_for(w1.close(), 10)
    await asyncio.wait_for(w2.close(), 10)
    lanes.close()


async def test_a_taken_over_lane_runs_its_started_turn_before_older_queued_rows(dbs,
                                                                              pg_dsn):
    """The dead replica's lane had started message 43's turn while the older row 42 still
    waited (routed after it). Taken over in id order, 42 ran first, on a transcript that
    already held 43's unanswered message: its one reply answered both (the checker's
    misrouted reply: an OpenAI message answered in a Telegram chat). Now the started turn
    runs first, as a restart on one host resumes them."""
    r1, r2 = dbs["r1"], dbs["r2"]
    ran: list = []

    async def runner(key, works, control):
        ran.extend((w.message_id, w.resume) for w in works)

    lanes = LaneManager(runner, mode="followup", debounce=0)
    kw = {"side_effecting": lambda t: False, "debounce": lambda *a: 0}
    w1, w2 = ClusterWork(r1, "r1", TTL, None, **kw), ClusterWork(r2, "r2", TTL, lanes, **kw)
    older, younger = _work(), _work()
    younger.message_id = "43"
    assert await w1.accept(KEY, older, "tg:1") and await w1.accept(KEY, younger, "tg:2")
    rows = [int(older.journal_id), int(younger.journal_id)]
    assert await r1.run(lambda c: w1._assign(c, KEY, rows)) == "r1"
    await pg_query(pg_dsn, "UPDATE cluster_work SET started = true WHERE id = $1", rows[1])
    await cluster_harness.pause(r1, "r1")
    assert await w2.take_over() == 2
    assert await w2.claim() == 2
    await until(lambda: len(ran) == 2, what="both turns")
    assert ran == [("43", "rerun"), ("42", "rerun")]
    await asyncio.wait_for(w1.close(), 10)
    await asyncio.wait_for(w2.close(), 10)
    lanes.close()


async def test_a_message_forwarded_to_the_lanes_holder_records_no_outcome_here(dbs, pg_dsn):
    """A platform message routed to the replica that holds its lane: the receiving
    replica's outcome recorder used to read the ``Forwarded`` lane result as an empty
    reply and record ``silent`` beside the holder's real outcome (which also hid a lost
    reply from the checker: a recorded outcome accounts for a missing reply)."""
    from gateway.journal.recorder import OutcomeRecorder
    from runtime.clock import SYSTEM_CLOCK
    r1, r2 = dbs["r1"], dbs["r2"]
    kw = {"side_effecting": lambda t: False, "debounce": lambda *a: 0}
    w1 = ClusterWork(r1, "r1", TTL, None, **kw)
    w2 = ClusterWork(r2, "r2", TTL, LaneManager(lambda *a: None), **kw)
    held, moved = _work(), _work()
    assert await w1.accept(KEY, held, "tg:1")
    assert await r1.run(lambda c: w1._assign(c, KEY, [int(held.journal_id)])) == "r1"
    recorder = OutcomeRecorder(SYSTEM_CLOCK)
    assert await w2.accept(KEY, moved, "tg:2")
    fut = w2.submit(KEY, moved, {"idle_debounce": 0})
    recorder.watch(moved, KEY, fut)
    assert type(await asyncio.wait_for(fut, 10)).__name__ == "Forwarded"
    await asyncio.sleep(0)
    assert dict(recorder.counts) == {}
    await asyncio.wait_for(w1.close(), 10)
    await asyncio.wait_for(w2.close(), 10)


async def test_a_turns_started_mark_is_committed_before_the_turn_goes_on(dbs, pg_dsn):
    """The started mark was batched and not awaited: a replica could die with its turn's
    user message in the transcript and the row not marked started, so the takeover ran an
    older row first, whose one reply answered that message too (the checker's misrouted
    reply, seed 201). ``turn_started`` now gives the turn a future set once the mark is
    committed (the executor awaits it before the transcript line)."""
    r1 = dbs["r1"]
    w1 = ClusterWork(r1, "r1", TTL, None, side_effecting=lambda t: False,
                     debounce=lambda *a: 0)
    work = _work()
    assert await w1.accept(KEY, work, "tg:1")
    row = int(work.journal_id)
    assert await r1.run(lambda c: w1._assign(c, KEY, [row])) == "r1"
    marked = w1.turn_started(work.run_id, [work])
    assert marked is not None
    await asyncio.wait_for(marked, 10)
    assert await pg_query(pg_dsn, "SELECT started FROM cluster_work WHERE id = $1",
                          row) == [(True,)]
    await asyncio.wait_for(w1.close(), 10)


def test_a_journaled_message_without_a_platform_id_has_a_transcript_id():
    """An OpenAI/webchat/CLI message on replicas (a row, no platform message id) used to
    be written to the transcript again when its turn was re-run after a takeover (the
    checker's wrong reply 'echo: m212 + m212'): it now carries its run id there."""
    from gateway.turns.work import transcript_id
    w = UserWork(agent_id="main", text="hi", channel="openai")
    assert transcript_id(w) is None  # one host: nothing re-runs it, nothing changes
    w.journal_id = "7"
    assert transcript_id(w) == f"run-{w.run_id}"
    w.message_id = "42"
    assert transcript_id(w) == "42"
