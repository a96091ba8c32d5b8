"""The dead-man's switch (``monitoring.ping_url``) against a local HTTP server, driven by
the fake clock: pings while healthy, ``/fail`` with the reason when a channel stops
receiving, pings again once it is back."""

from __future__ import annotations

import pytest
from aiohttp import web

from runtime.clock import FakeClock
from tests.channel_harness import until
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]
T0 = 1_767_225_600.0


class Monitor:
    """A healthchecks-style endpoint on 127.0.0.1 that records every request."""

    def __init__(self) -> None:
        self.hits: list[tuple[str, str]] = []  # (path, reason)

    async def __aenter__(self) -> Monitor:
        app = web.Application()

        async def hit(request: web.Request) -> web.Response:
            self.hits.append((request.path, request.query.get("reason", "")))
            return web.Response(text="OK")
        app.router.add_get("/{tail:.*}", hit)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


async def test_pings_while_healthy_and_fails_with_the_reason(tmp_path, tg):
    clock = FakeClock(T0)
    async with Monitor() as mon:
        cfg = base_config(tmp_path / "state", channels={"telegram": {
            "enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
            "poll_timeout": 1, "dm_policy": "open", "unhealthy_after": 5}},
            monitoring={"ping_url": f"{mon.url}/ping/abc-123", "ping_every": "60s"})
        async with running_gateway(cfg, clock=clock) as gw:
            await until(lambda: gw.channel_status()["telegram"]["state"] == "connected")
            assert mon.hits == []  # the first ping comes after ping_every
            await clock.advance(60)
            await until(lambda: mon.hits, what="the first ping")
            assert mon.hits == [("/ping/abc-123", "")]
            await tg.stop()  # the platform goes away: the channel cannot receive
            await until(lambda: gw.channel_status()["telegram"]["state"] != "connected",
                        what="the channel noticing")
            await clock.advance(60)
            await until(lambda: len(mon.hits) == 2, what="the fail ping")
            path, reason = mon.hits[1]
            assert path == "/ping/abc-123/fail"
            assert reason == "channel telegram: not receiving"
            status = gw.status()["monitoring"]
            assert (status["pings"], status["fails"], status["errors"]) == (1, 1, 0)
