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


def _route_of(payload):
    """The test's merge key: the letter before the colon ("t:1" -> "t")."""
    return payload.split(":")[0]


async def test_collect_merges_only_messages_with_the_same_reply_route():
    clock = FakeClock()
    rec = Recorder(hold=True)
    lanes = LaneManager(rec, clock=clock, mode="collect", debounce=0.0, merge_key=_route_of)
    first = lanes.submit("s", "t:1")
    await clock.settle()
    later = [lanes.submit("s", p) for p in ("t:2", "t:3", "o:4", "t:5", "t:6")]
    rec.gate.set()
    results = await asyncio.gather(first, *later)
    # a message for another route never joins a batch: its own turn, in arrival order
    assert [ps for _, ps in rec.batches] == [["t:1"], ["t:2", "t:3"], ["o:4"],
                                             ["t:5", "t:6"]]
    assert results[3] == "done:o:4"


async def test_an_idle_burst_and_steering_keep_to_one_reply_route():
    clock = FakeClock()
    rec = Recorder()
    lanes = LaneManager(rec, clock=clock, mode="steer", debounce=0.0, merge_key=_route_of)
    burst = [lanes.submit("s", p, idle_debounce=1.0) for p in ("t:1", "o:2", "t:3")]
    await clock.advance(1.0)
    await asyncio.gather(*burst)
    assert [ps for _, ps in rec.batches] == [["t:1"], ["o:2"], ["t:3"]]
    rec.gate.clear()
    running = lanes.submit("s", "t:4")
    await clock.settle()
    other, same = lanes.submit("s", "o:5"), lanes.submit("s", "t:6")
    rec.gate.set()
    await asyncio.gather(running, other, same)
    assert rec.steered == ["t:6"]  # the other route's message is not steered in: next turn
    assert [ps for _, ps in rec.batches][3:] == [["t:4"], ["o:5"]]


async def test_interrupt_carries_queued_messages_as_one_turn_per_route():
    clock = FakeClock()
    started = asyncio.Event()
    calls = []

    async def runner(key, payloads, control):
        calls.append(payloads)
        if payloads == ["t:slow"]:
            started.set()
            await asyncio.Event().wait()
        return "ok"

    lanes = LaneManager(runner, clock=clock, mode="interrupt", debounce=0.0,
                        merge_key=_route_of)
    slow = lanes.submit("s", "t:slow")
    await started.wait()
    queued = lanes.submit("s", "o:1", mode="followup")  # another route: waits its turn
    new = lanes.submit("s", "t:2")
    assert isinstance(await slow, TurnInterrupted)
    await asyncio.gather(queued, new)
    assert calls == [["t:slow"], ["o:1"], ["t:2"]]


async def test_gateway_reply_routes_keep_request_surfaces_out_of_platform_turns():
    """The gateway's merge key: a platform message merges with the same chat's messages
    only; an awaited request (OpenAI API, webchat, ``agent -m``: no route) never merges."""
    from gateway.routing import Route
    from gateway.turns.work import UserWork, reply_route

    def tg(text, chat="42"):
        return UserWork(agent_id="main", text=text, channel="telegram",
                        route=Route("telegram", chat))

    clock = FakeClock()
    seen = []

    async def runner(key, payloads, control):
        seen.append([w.text for w in payloads])
        if len(seen) == 1:
            await clock.sleep(1.0)
        return "ok"

    lanes = LaneManager(runner, clock=clock, mode="collect", debounce=0.0,
                        merge_key=reply_route)
    futs = [lanes.submit("s", tg("busy"))]
    await clock.settle()
    futs += [lanes.submit("s", w) for w in (
        tg("a"), UserWork(agent_id="main", text="api1", channel="openai"),
        UserWork(agent_id="main", text="api2", channel="openai"), tg("b"), tg("c"),
        tg("other chat", chat="43"), tg("d"))]
    await clock.advance(1.0)
    await asyncio.gather(*futs)
    assert seen == [["busy"], ["a"], ["api1"], ["api2"], ["b", "c"], ["other chat"], ["d"]]


async def test_gateway_merge_key_keeps_each_group_member_in_turns_of_their_own():
    """Two members of one group chat: while the session is busy their messages do not
    merge (a turn acts for one sender: memory scope, owner checks), run in arrival order,
    and one member's message neither steers into nor interrupts the other's turn. The
    ids of one person (identity links) count as one sender."""
    from gateway.routing import IdentityLinks, Route
    from gateway.turns.work import UserWork, reply_route

    links = IdentityLinks({"ann": ["telegram:101", "telegram:111"]})

    def tg(text, sender):
        return UserWork(agent_id="main", text=text, channel="telegram", chat_type="group",
                        sender_id=sender, route=Route("telegram", "-100"))

    clock = FakeClock()
    rec = Recorder(hold=True)
    lanes = LaneManager(rec, clock=clock, mode="collect", debounce=0.0,
                        merge_key=lambda w: reply_route(w, links))
    futs = [lanes.submit("s", tg("busy", "101"))]
    await clock.settle()
    futs += [lanes.submit("s", tg(t, s)) for t, s in (
        ("eve asks", "303"), ("ann again", "101"), ("ann's other id", "111"),
        ("eve again", "303"))]
    rec.gate.set()
    await asyncio.gather(*futs)
    assert [[w.text for w in ps] for _, ps in rec.batches] == [
        ["busy"], ["eve asks"], ["ann again", "ann's other id"], ["eve again"]]
    for mode in ("steer", "interrupt"):
        rec.gate.clear()
        lanes.mode = mode
        running = lanes.submit("s", tg(f"ann {mode}s", "101"))
        await clock.settle()
        other = lanes.submit("s", tg(f"eve during {mode}", "303"))
        await clock.settle()
        assert lanes._lanes["s"].control._steer == []
        rec.gate.set()
        assert not isinstance(await running, TurnInterrupted)  # eve did not interrupt
        await other
        assert [[w.text for w in ps] for _, ps in rec.batches][-2:] == [
            [f"ann {mode}s"], [f"eve during {mode}"]]
    assert rec.steered == []
    # replicas: a message handed to the lane holder through its cluster_work row (JSON)
    # keeps its sender, so the holder's lanes apply the same rule
    from gateway.journal.tracking import work_from_dict, work_to_dict
    w = tg("hi", "111")
    assert reply_route(work_from_dict(work_to_dict(w), "1"), links) == reply_route(w, links)
    assert reply_route(w, links)[-1] == "ann"
