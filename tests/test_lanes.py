"""Lanes: per-session serial order, global caps, queue modes, nothing lost or run twice."""

import asyncio

import pytest

from runtime.clock import FakeClock
from runtime.lanes import LaneClosed, LaneManager, TurnInterrupted


class Recorder:
    """A runner that records batches and concurrency; ``gate`` holds turns open."""

    def __init__(self, clock=None, hold=False):
        self.batches: list[tuple[str, list]] = []
        self.active: dict[str, int] = {}
        self.max_total = 0
        self.max_per_key: dict[str, int] = {}
        self.total = 0
        self.gate = asyncio.Event()
        if not hold:
            self.gate.set()
        self.steered: list = []

    async def __call__(self, key, payloads, control):
        self.active[key] = self.active.get(key, 0) + 1
        self.total += 1
        self.max_total = max(self.max_total, self.total)
        self.max_per_key[key] = max(self.max_per_key.get(key, 0), self.active[key])
        try:
            await self.gate.wait()
            await asyncio.sleep(0)
            self.steered += control.take_steer()
            self.batches.append((key, list(payloads)))
            return f"done:{'+'.join(map(str, payloads))}"
        finally:
            self.active[key] -= 1
            self.total -= 1


async def test_fifty_messages_to_one_session_run_in_order_one_at_a_time():
    rec = Recorder()
    lanes = LaneManager(rec, clock=FakeClock(), mode="followup")
    futs = [lanes.submit("s", i) for i in range(50)]
    results = await asyncio.gather(*futs)
    assert [p for _, ps in rec.batches for p in ps] == list(range(50))
    assert all(len(ps) == 1 for _, ps in rec.batches)
    assert rec.max_per_key["s"] == 1
    assert results == [f"done:{i}" for i in range(50)]
    assert lanes.lane_count() == 0  # idle lanes are freed


async def test_two_hundred_sessions_stay_within_the_global_cap():
    rec = Recorder()
    lanes = LaneManager(rec, caps={"main": 4}, clock=FakeClock(), mode="followup")
    futs = [lanes.submit(f"s{i}", i) for i in range(200)]
    await asyncio.gather(*futs)
    assert rec.max_total == 4
    assert len(rec.batches) == 200
    assert lanes.lane_count() == 0


async def test_cron_kind_has_its_own_cap():
    rec = Recorder(hold=True)
    lanes = LaneManager(rec, clock=FakeClock(), mode="followup")
    futs = [lanes.submit(f"c{i}", i, kind="cron", mergeable=False) for i in range(10)]
    futs += [lanes.submit(f"m{i}", i) for i in range(40)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert lanes.stats()["running"] == {"main": 32, "cron": 4, "subagent": 0}  # defaults
    rec.gate.set()
    await asyncio.gather(*futs)
    assert lanes.caps == {"main": 32, "cron": 4, "subagent": 16}


async def test_message_to_an_idle_session_starts_at_once_whatever_the_debounce():
    clock = FakeClock()
    rec = Recorder()
    lanes = LaneManager(rec, clock=clock, mode="collect", debounce=1.0)
    fut = lanes.submit("s", "a")
    for _ in range(5):  # no clock advance at all: the turn must not wait for the debounce
        await asyncio.sleep(0)
    assert fut.done() and fut.result() == "done:a"
    assert clock.monotonic() == FakeClock().monotonic()


async def test_channel_idle_debounce_merges_a_burst_into_one_turn():
    clock = FakeClock()
    rec = Recorder()
    lanes = LaneManager(rec, clock=clock, mode="followup", debounce=0.0)
    futs = [lanes.submit("s", "a", idle_debounce=1.0)]
    await clock.advance(0.5)
    futs.append(lanes.submit("s", "b", idle_debounce=1.0))
    await clock.advance(0.9)
    futs.append(lanes.submit("s", "c", idle_debounce=1.0))
    assert rec.batches == []  # each message extends the window
    await clock.advance(1.0)
    await asyncio.gather(*futs)
    assert rec.batches == [("s", ["a", "b", "c"])]
    assert {f.result() for f in futs} == {"done:a+b+c"}


async def test_busy_collect_still_waits_for_the_queue_debounce():
    clock = FakeClock()
    rec = Recorder(hold=True)
    lanes = LaneManager(rec, clock=clock, mode="collect", debounce=1.0)
    first = lanes.submit("s", 1)
    await clock.settle()
    later = [lanes.submit("s", 2)]
    await clock.advance(0.5)
    later.append(lanes.submit("s", 3))
    rec.gate.set()
    await first
    await clock.advance(0.9)
    assert rec.batches == [("s", [1])]  # 2 and 3 still collecting (busy-session rule)
    await clock.advance(0.2)
    await asyncio.gather(*later)
    assert rec.batches == [("s", [1]), ("s", [2, 3])]


async def test_a_turn_waiting_in_cap_released_lets_another_session_run():
    clock = FakeClock()
    provider_free = asyncio.Event()
    ran = []

    async def runner(key, payloads, control):
        if key == "slow":
            async with control.cap_released():  # e.g. waiting for a provider slot
                await provider_free.wait()
        ran.append(key)
        return key

    lanes = LaneManager(runner, caps={"main": 1}, clock=clock, mode="followup")
    slow = lanes.submit("slow", 1)
    await clock.settle()
    other = lanes.submit("other", 2)
    assert await other == "other"  # ran while "slow" waited, within cap 1
    provider_free.set()
    assert await slow == "slow"
    assert ran == ["other", "slow"]
    assert lanes.stats()["running"]["main"] == 0
    lanes.submit("again", 3)
    await clock.settle()
    assert ran[-1] == "again"  # the cap slot was handed back exactly once


async def test_collect_merges_messages_that_arrive_while_busy():
    clock = FakeClock()
    rec = Recorder(hold=True)
    lanes = LaneManager(rec, clock=clock, mode="collect", debounce=0.0)
    first = lanes.submit("s", 1)
    await clock.settle()
    later = [lanes.submit("s", i) for i in (2, 3, 4)]
    rec.gate.set()
    await asyncio.gather(first, *later)
    assert rec.batches == [("s", [1]), ("s", [2, 3, 4])]


async def test_non_mergeable_work_keeps_its_own_turn():
    clock = FakeClock()
    rec = Recorder(hold=True)
    lanes = LaneManager(rec, clock=clock, mode="collect", debounce=0.0)
    futs = [lanes.submit("s", "u1"), lanes.submit("s", "hb", mergeable=False),
            lanes.submit("s", "u2"), lanes.submit("s", "u3")]
    await clock.settle()
    rec.gate.set()
    await asyncio.gather(*futs)
    assert [ps for _, ps in rec.batches] == [["u1"], ["hb"], ["u2", "u3"]]


async def test_steer_injects_into_the_running_turn():
    clock = FakeClock()
    rec = Recorder(hold=True)
    lanes = LaneManager(rec, clock=clock, mode="steer", debounce=0.0)
    first = lanes.submit("s", "task")
    await clock.settle()
    steer = lanes.submit("s", "also this")
    rec.gate.set()
    assert await first == "done:task"
    assert await steer == "done:task"  # answered by the turn that took it
    assert rec.steered == ["also this"]
    assert len(rec.batches) == 1


async def test_steer_not_taken_runs_next():
    clock = FakeClock()
    started = asyncio.Event()
    release = asyncio.Event()
    seen = []

    async def runner(key, payloads, control):
        seen.append(payloads)
        started.set()
        await release.wait()
        return "ok"  # never calls take_steer

    lanes = LaneManager(runner, clock=clock, mode="steer", debounce=0.0)
    a = lanes.submit("s", "a")
    await started.wait()
    b = lanes.submit("s", "b")
    release.set()
    await asyncio.gather(a, b)
    assert seen == [["a"], ["b"]]


async def test_interrupt_aborts_the_running_turn_then_runs_the_new_message():
    clock = FakeClock()
    started = asyncio.Event()
    calls = []

    async def runner(key, payloads, control):
        calls.append(payloads)
        if payloads == ["slow"]:
            started.set()
            await asyncio.Event().wait()  # never answers
        return "ok:" + ",".join(payloads)

    lanes = LaneManager(runner, clock=clock, mode="interrupt", debounce=0.0)
    slow = lanes.submit("s", "slow")
    await started.wait()
    fast = lanes.submit("s", "stop, do this")
    assert isinstance(await slow, TurnInterrupted)
    assert await fast == "ok:stop, do this"
    assert calls == [["slow"], ["stop, do this"]]


async def test_runner_exception_reaches_every_merged_item_once():
    clock = FakeClock()

    async def runner(key, payloads, control):
        raise RuntimeError("boom")

    lanes = LaneManager(runner, clock=clock, mode="collect", debounce=1.0)
    futs = [lanes.submit("s", i) for i in range(3)]
    await clock.advance(1.0)
    for f in futs:
        with pytest.raises(RuntimeError, match="boom"):
            await f


async def test_close_and_drain():
    clock = FakeClock()
    rec = Recorder(hold=True)
    lanes = LaneManager(rec, clock=clock, mode="followup")
    fut = lanes.submit("s", 1)
    await clock.settle()
    lanes.close()
    with pytest.raises(LaneClosed):
        lanes.submit("s", 2)
    drain = asyncio.ensure_future(lanes.drain(5.0))
    await clock.advance(1.0)
    assert not drain.done()
    rec.gate.set()
    assert await drain == 0
    assert await fut == "done:1"


async def test_drain_cancels_after_grace():
    clock = FakeClock()
    rec = Recorder(hold=True)
    lanes = LaneManager(rec, clock=clock, mode="followup")
    fut = lanes.submit("s", 1)
    await clock.settle()
    drain = asyncio.ensure_future(lanes.drain(5.0))
    await clock.advance(5.1)
    assert await drain == 1
    assert fut.cancelled()
