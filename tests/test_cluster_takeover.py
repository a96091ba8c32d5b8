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
