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
