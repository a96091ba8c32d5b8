"""The FakeClock's timeout behaves like ``asyncio.timeout``: a deadline already passed
(0 or negative seconds: an approval that expired while its prompt was being sent) fires
at once instead of never; a later one fires only when the clock is advanced past it."""

from __future__ import annotations

import asyncio

import pytest

from runtime.clock import FakeClock


@pytest.mark.parametrize("seconds", [0, -5.0])
async def test_a_passed_deadline_times_out_at_once_like_asyncio(seconds):
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(seconds):
            await asyncio.Event().wait()
    clock = FakeClock()

    async def wait() -> None:
        async with clock.timeout(seconds):
            await asyncio.Event().wait()
    task = asyncio.create_task(wait())
    done, _ = await asyncio.wait([task], timeout=2)  # real time: a hang fails
    task.cancel()
    assert done, "the passed deadline never fired"
    with pytest.raises(TimeoutError):
        task.result()


async def test_a_later_deadline_fires_only_when_the_clock_passes_it():
    clock = FakeClock()

    async def wait() -> None:
        async with clock.timeout(10):
            await asyncio.Event().wait()
    task = asyncio.create_task(wait())
    await clock.settle()
    await clock.advance(9)
    assert not task.done()
    await clock.advance(2)
    with pytest.raises(TimeoutError):
        await task
    async with clock.timeout(None):  # None: never
        await clock.settle()
