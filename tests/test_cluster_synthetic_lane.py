"""The per-round lane check of the gateway's own turns (gateway/turns/executor.py
``_synthetic``, TurnInput ``lane_held``; the user-turn version is in
test_cluster_fencing.py): a cron run and a heartbeat beat on replica r1 ask before each
model round whether r1 still runs their session's lane. r1 is paused during the first
round (a tool call) and r2 takes the lane over meanwhile (on a real PostgreSQL): the
second round's check says the lane moved, and the turn ends there — one model call, no
reply delivered, the run recorded skipped. Before, the paused replica went on with the
turn's model rounds and tools beside the new lane holder."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from gateway.cluster.synthetic import take
from gateway.cluster.work import ClusterWork
from gateway.routing import cron_session_key
from runtime.clock import FakeClock
from tests import cluster_harness
from tests.scheduler_harness import MAIN, beat, config, gateway

TTL = 3.0

dbs = cluster_harness.replica_dbs  # fixture
_pause = cluster_harness.pause


async def _lane_check(dbs: dict[str, Any], key: str) -> tuple[Any, list[str], Any]:
    """r1 holds the lane of ``key`` (taken as a synthetic turn takes it, heartbeat just
    sent); returns ``(lane_held, asked, w1)``: ``lane_held(key)`` is r1's ``runs_lane``,
    except that on the second ask r1 has been stopped past the TTL and r2 took the lane."""
    clock = FakeClock()
    r1, r2 = dbs["r1"], dbs["r2"]
    r1.clock = clock
    kw = {"side_effecting": lambda t: False, "debounce": lambda *a: 0}
    w1, w2 = ClusterWork(r1, "r1", TTL, None, **kw), ClusterWork(r2, "r2", TTL, None, **kw)
    assert (await r1.run(lambda c: take(c, w1, key))).holder == "r1"
    w1.held[key] = 0.0
    w1.beat_ok(clock.monotonic())
    asked: list[str] = []

    async def lane_held(k: str) -> bool:
        asked.append(k)
        if len(asked) == 2:  # r1 was stopped during round 1, past the TTL; r2 took over
            await _pause(r1, "r1")
            assert (await r2.run(lambda c: take(c, w2, key))).holder == "r2"
            await clock.advance(TTL)
        got = w1.runs_lane(k)
        return await got if inspect.isawaitable(got) else got
    return lane_held, asked, w1


async def test_a_cron_run_whose_lane_was_taken_over_makes_no_further_model_call(
        dbs, tmp_path, model):
    from gateway.scheduling.cron_jobs import job_from_spec
    model.script_tool_call("read", {"path": "nothing-here.md"})
    model.script_text("the stale cron answer")
    async with gateway(config(tmp_path, model.base_url), FakeClock()) as gw:
        job = await gw.scheduling.cron.add(job_from_spec(
            {"name": "digest", "schedule": {"kind": "every", "interval": 3600},
             "message": "summarise", "session_target": "isolated",
             "delivery": "testchan:5"}, now=gw.clock.time(), config=gw.config,
            channels={"testchan"}))
        key = cron_session_key("main", job.id)
        lane_held, asked, w1 = await _lane_check(dbs, key)
        gw.executor.lane_held = lane_held
        ran = await gw.scheduling.cron.run_now(job.id)
        assert asked == [key, key] and len(model.requests) == 1
        assert (ran.status, ran.error) == ("skipped", "taken over by another replica")
        assert gw.testchan.sent == []  # nothing delivered from the stale replica
    await w1.close()


async def test_a_heartbeat_whose_lane_was_taken_over_makes_no_further_model_call(
        dbs, tmp_path, model):
    model.script_tool_call("read", {"path": "nothing-here.md"})
    model.script_text("something the stale beat would say")
    clock = FakeClock()
    hb = {"every": "100h", "target": "testchan:7"}
    async with gateway(config(tmp_path, model.base_url, heartbeat=hb), clock) as gw:
        lane_held, asked, w1 = await _lane_check(dbs, MAIN)
        gw.executor.lane_held = lane_held
        outcome = await beat(gw, clock)
        assert asked == [MAIN, MAIN] and len(model.requests) == 1
        assert (outcome.outcome, outcome.reason) == ("skipped",
                                                     "taken over by another replica")
        assert gw.testchan.sent == []
        # the beat's held lines (its tool round) are dropped: r2 runs the session now
        entry = gw.agents["main"].store.get(MAIN)
        slog = gw.executor.logs.get("main", entry.session_id, MAIN, max_tokens=10_000)
        assert not [e for e, _bad in slog.entries_reversed()
                    if e and e.get("type") == "message"]
    await w1.close()


@pytest.mark.parametrize("answer", ["read before the pause", "timed out on the wake-up"])
async def test_a_lease_answer_that_came_back_after_a_pause_is_asked_again(dbs, answer):
    """``runs_lane``'s lease query (beats late) is in flight when r1 is stopped past the
    TTL and r2 takes the lane; on SIGCONT the answer comes back saying the lane is still
    r1's (read before the takeover), or the query times out at once (PostgreSQL
    "unreachable" reads as True). Either answer is older than half the TTL: asked again,
    it says the lane moved. Before, the turn made its model call beside r2's (seen with
    bench/cluster_checker.py: a call whose prompt lacked the messages r2 had answered)."""
    from gateway.cluster.db import ClusterUnavailable
    clock = FakeClock()
    r1, r2 = dbs["r1"], dbs["r2"]
    r1.clock = clock
    kw = {"side_effecting": lambda t: False, "debounce": lambda *a: 0}
    w1, w2 = ClusterWork(r1, "r1", TTL, None, **kw), ClusterWork(r2, "r2", TTL, None, **kw)
    key = "agent:main:telegram:dm:1"
    assert (await r1.run(lambda c: take(c, w1, key))).holder == "r1"
    w1.held[key] = 0.0
    w1.beat_ok(clock.monotonic())
    await clock.advance(TTL)  # the beats are late: the lease row is asked
    real, stalled = r1.run, []

    async def run(fn):
        got = await real(fn)
        if not stalled:  # SIGSTOP here, r2 takes the lane meanwhile, then SIGCONT
            stalled.append(True)
            await _pause(r1, "r1")
            assert (await r2.run(lambda c: take(c, w2, key))).holder == "r2"
            await clock.advance(TTL)
            if answer == "timed out on the wake-up":
                raise ClusterUnavailable("timeout")
        return got
    r1.run = run
    checked = w1.runs_lane(key)
    assert checked is not True and await checked is False
    assert stalled and not w1.fences.holds(key)
    await w1.close()


async def test_a_turn_stopped_inside_its_model_call_asks_again_before_the_send(
        tmp_path, model):
    """The lane check before a round passed; then the process stopped inside the model
    call before the request went out (a slot wait, a retry's sleep, a SIGSTOP) while
    another replica took the session. Past ``LANE_RECHECK_S`` since the check, the
    attempt asks again just before the send (runtime/turn/runner.py ``_recheck``) and
    the turn ends without a model request. Before, the request went out after SIGCONT
    with a stale prompt, beside the new holder's calls (bench/cluster_checker.py: a
    call overlapping the next one and lacking the messages answered meanwhile)."""
    from gateway.scheduling.cron_jobs import job_from_spec
    model.script_text("the stale cron answer")
    clock = FakeClock()
    async with gateway(config(tmp_path, model.base_url), clock) as gw:
        job = await gw.scheduling.cron.add(job_from_spec(
            {"name": "digest", "schedule": {"kind": "every", "interval": 3600},
             "message": "summarise", "session_target": "isolated",
             "delivery": "testchan:5"}, now=gw.clock.time(), config=gw.config,
            channels={"testchan"}))
        asked, moved = [], []

        def lane_held(key: str) -> bool:
            asked.append(key)
            return not moved
        gw.executor.lane_held = lane_held
        caller = gw.agents["main"].runner.caller
        real = caller._credential_key

        async def stopped_here(*a, **kw):  # past the round's check, before the send
            moved.append(True)  # ... another replica took the lane meanwhile
            await clock.advance(5.0)
            return await real(*a, **kw)
        caller._credential_key = stopped_here
        ran = await gw.scheduling.cron.run_now(job.id)
        key = cron_session_key("main", job.id)
        assert asked == [key, key] and model.requests == []
        assert (ran.status, ran.error) == ("skipped", "taken over by another replica")
        assert gw.testchan.sent == []
