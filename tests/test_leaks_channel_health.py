"""Issue 8 item 10: a deaf channel does not hide. FakeTelegram answers 409 (another poller
with the same token) to every ``getUpdates``; through the whole gateway (the real
python-telegram-bot) the channel becomes one ERROR with the likely cause after
``channels.telegram.unhealthy_after``, lands in ``status.problems``, ``/readyz`` answers 503
naming it while ``/healthz`` stays 200, systemd's STATUS says why; when the other poller
goes away it recovers and all of that clears. Time is the gateway's FakeClock: the
Conflict backoff (5 s doubling to 30 s, jittered) is advanced through, never waited."""

from __future__ import annotations

import asyncio
import time
import re

import aiohttp
import pytest
from structlog.testing import capture_logs

from gateway.channels.health import likely_cause
from runtime.clock import FakeClock
from tests.channel_harness import log_events, until
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(40),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

CONFLICT = ("Conflict: terminated by other getUpdates request; make sure that only one bot "
            "instance is running")


class Notes:
    """A stand-in for the systemd notifier that records what systemd would see."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def notify(self, *states: str) -> bool:
        self.sent += states
        return True


def down_seconds(problem: str) -> int:
    m = re.search(r"for (?:(\d+)m )?(\d+)s\)", problem)
    assert m, problem
    return int(m.group(1) or 0) * 60 + int(m.group(2))


async def get(gw, path: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.get(
            f"http://127.0.0.1:{gw.port}{path}",
            headers={"Authorization": f"Bearer {gw.token}"}) as r:
        return r.status, await r.json()


async def advance_until(clock: FakeClock, pred, what: str, step: float = 0.5,
                        limit: float = 120.0) -> None:
    """Advance the gateway clock in ``step`` seconds until ``pred()``; real I/O (the fake
    Bot API answering) gets a few real milliseconds between steps. On a loaded machine a
    poll in flight can take many steps of gateway time, so the bound is ``limit`` gateway
    seconds once 20 real seconds have passed as well."""
    moved, t0 = 0.0, time.monotonic()
    while not pred():
        assert moved < limit or time.monotonic() - t0 < 20, \
            f"{what} did not happen within {moved:g}s of gateway time"
        await clock.advance(step)
        await asyncio.sleep(0.01)
        moved += step


async def test_a_telegram_409_loop_is_an_error_a_problem_and_not_ready(tmp_path, tg):
    tg.fail("getUpdates", status=409, count=10**6, description=CONFLICT)
    section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
               "poll_timeout": 1, "dm_policy": "open", "unhealthy_after": "1.5s"}
    clock = FakeClock()
    async with FakeOpenAI() as model:
        cfg = base_config(tmp_path / "state", model.base_url, channels={"telegram": section})
        with capture_logs() as logs:
            async with running_gateway(cfg, clock=clock) as gw:
                gw.notifier = notes = Notes()
                assert (await get(gw, "/readyz"))[0] == 200  # not yet: a blip is fine
                await until(lambda: log_events(logs, "telegram_connection_lost"),
                            what="the first 409")
                await advance_until(clock, lambda: log_events(logs, "channel_unhealthy"),
                                    "the unhealthy report", limit=10)
                status, ready = await get(gw, "/readyz")
                assert status == 503 and ready["unhealthy_channels"] == ["telegram"]
                assert "telegram" in ready["status"]
                assert (await get(gw, "/healthz"))[0] == 200
                _, st = await get(gw, "/status")
                [problem] = [p for p in st["problems"] if "telegram" in p]
                assert "another process polls with this bot token" in problem
                first = down_seconds(problem)
                await clock.advance(2)
                _, st = await get(gw, "/status")
                [problem] = [p for p in st["problems"] if "telegram" in p]
                assert down_seconds(problem) >= first + 2  # counted up to now, not frozen
                assert st["channels"]["telegram"]["state"] == "reconnecting"
                assert any(s.startswith("STATUS=degraded: telegram cannot receive (another "
                                        "process polls") for s in notes.sent)
                # The other poller stops: the channel recovers and everything clears.
                tg._failures.clear()
                await advance_until(clock, lambda: log_events(logs, "channel_recovered"),
                                    "recovery", limit=60)
                assert (await get(gw, "/readyz"))[0] == 200
                _, st = await get(gw, "/status")
                assert not [p for p in st["problems"] if "telegram" in p]
                assert notes.sent[-1].startswith("STATUS=serving")
    [err] = log_events(logs, "channel_unhealthy")  # once, not every retry
    assert err["log_level"] == "error" and err["channel"] == "telegram"
    assert "another process polls with this bot token" in err["likely_cause"]
    assert "Conflict" in err["last_error"] and tg.token not in str(err)


def test_likely_causes():
    assert "another process polls" in likely_cause("telegram", "reconnecting", CONFLICT)
    assert "token was rejected" in likely_cause("slack", "failed", "invalid_auth")
    assert "cannot be reached" in likely_cause("discord", "reconnecting",
                                               "Cannot connect to host 127.0.0.1:9")
    assert "unknown" in likely_cause("discord", "reconnecting", None)
