"""Shutdown with channel plugins that do not stop (gateway/channels/stopping.py,
gateway/service/exit.py, channels/tasks.py): a receive loop that swallows its
cancellation and a close() whose ``open()`` of a file blocks in a thread. The gateway stops
within ``gateway.channel_stop_timeout`` and the process exits after SIGTERM anyway, with a
warning naming the channel. Third-party plugins are real distributions written into a temp
dir (tests/helpers.py ``install_plugin``)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from structlog.testing import capture_logs

from channels.tasks import cancel_and_wait
from gateway.channels.stopping import CANCEL_WAIT, stop_channels
from gateway.service.exit import EXIT_WAIT
from runtime.clock import FakeClock
from tests.helpers import GatewayProcess, base_config, install_plugin

pytestmark = pytest.mark.timeout(30)

STUBBORN = '''
import asyncio
from channels.sdk import AccountConfig, ChannelAdapter, ChannelPlugin, sent

class Config(AccountConfig):
    enabled: bool = False
    fifo: str = ""

class Adapter(ChannelAdapter):
    name = "{name}"

    async def open(self):
        self._rx = asyncio.ensure_future(self._receive())
        self.set_state("connected")

    async def _receive(self):
        while True:
            try:
                await asyncio.sleep(3600)
            except BaseException:  # the QA pattern: swallows its own cancellation
                pass

    async def close(self):
        if self.config.fifo:  # open() of a FIFO nobody writes: blocks its thread for good
            await asyncio.to_thread(lambda: open(self.config.fifo).read())
        self._rx.cancel()
        await self._rx  # never returns: the receive loop ignores the cancel

    async def send(self, message):
        return sent("1")

PLUGIN = ChannelPlugin(name="{name}", config=Config,
                       create=lambda account, config, context: Adapter(account, config, context))
'''


def events(gw: GatewayProcess, name: str) -> list[dict]:
    return [line for line in gw.log_lines() if line.get("event") == name]


def test_sigterm_exits_within_the_bound_when_channels_ignore_cancellation(tmp_path):
    """SIGTERM on a real gateway process with two channels that never stop: the process
    exits 0 within channel_stop_timeout + the cancel and exit waits, logging which
    channel it left behind and what it did not wait for."""
    site = tmp_path / "site"
    site.mkdir()
    install_plugin(site, "tidegate-sulk", "sulk", "sulk_channel", STUBBORN.format(name="sulk"))
    install_plugin(site, "tidegate-stuck", "stuck", "stuck_channel",
                   STUBBORN.format(name="stuck"))
    fifo = tmp_path / "hung.fifo"
    os.mkfifo(fifo)
    cfg = base_config(tmp_path / "state", channels={
        "sulk": {"enabled": True}, "stuck": {"enabled": True, "fifo": str(fifo)}})
    cfg["gateway"]["channel_stop_timeout"] = "0.5s"
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    gw = GatewayProcess(tmp_path, cfg, env={"PYTHONPATH": path}).start()
    began = time.monotonic()
    code = gw.stop(timeout=0.5 + CANCEL_WAIT + EXIT_WAIT + 3)
    took = time.monotonic() - began
    assert code == 0 and took < 0.5 + CANCEL_WAIT + EXIT_WAIT + 3
    timed_out = {e["channel"] for e in events(gw, "channel_stop_timed_out")}
    assert timed_out == {"sulk", "stuck"}
    [left] = events(gw, "channel_stop_abandoned")  # "stuck" unwound; its thread did not
    assert left["channel"] == "sulk" and left["level"] == "warning"
    [forced] = events(gw, "gateway_exit_forced")
    waiting = " ".join(forced["waiting_on"])
    assert "task channel-stop:sulk" in waiting and "thread tidegate-worker" in waiting
    assert events(gw, "gateway_stopped")


async def test_stops_are_side_by_side_and_a_stubborn_one_is_left_behind():
    """In process, on the fake clock: two stops that ignore cancellation take one
    channel_stop_timeout together (not one each); both are left behind, and a second
    stop of the same adapters (the cluster's) does not wait for them again."""
    class Stubborn:
        account_id = "default"

        def __init__(self, name: str) -> None:
            self.name, self.stubborn = name, True

        async def stop(self) -> None:
            while self.stubborn:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    pass

    clock = FakeClock()
    chans = [Stubborn("a"), Stubborn("b")]
    with capture_logs() as logs:
        stop = asyncio.ensure_future(stop_channels(chans, timeout=10, clock=clock))
        await clock.settle()
        await clock.advance(10)
        assert not stop.done()  # the cancelled stops get CANCEL_WAIT to unwind
        await clock.advance(CANCEL_WAIT)
        assert await asyncio.wait_for(stop, 2) == ["a", "b"]
        assert await asyncio.wait_for(stop_channels(chans, timeout=10, clock=clock),
                                      2) == ["a", "b"]
    left = [e["channel"] for e in logs if e["event"] == "channel_stop_abandoned"]
    assert left == ["a", "b"]
    for ch in chans:  # let the test's loop end: they give up at the next cancellation
        ch.stubborn = False
    behind = [t for t in asyncio.all_tasks() if t.get_name().startswith("channel-stop:")]
    for task in behind:
        task.cancel()
    await asyncio.wait(behind, timeout=2)


async def test_cancel_and_wait_lets_the_callers_own_cancellation_through():
    """Waiting for a cancelled task, the caller's cancellation is not swallowed (the old
    ``except CancelledError: pass`` after ``await task`` kept a stop running)."""
    async def slow_unwind():
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(3600)  # a long clean-up

    async def stopper(task):
        await cancel_and_wait(task)
        return "carried on"

    inner = asyncio.ensure_future(slow_unwind())
    await asyncio.sleep(0)
    outer = asyncio.ensure_future(stopper(inner))
    await asyncio.sleep(0)
    outer.cancel()
    await asyncio.sleep(0)
    inner.cancel()  # its clean-up is cut short: it ends cancelled
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(outer, 2)
    done = asyncio.ensure_future(asyncio.sleep(0))
    await cancel_and_wait(done)  # a task's own cancellation is swallowed: no raise
    assert done.cancelled()
