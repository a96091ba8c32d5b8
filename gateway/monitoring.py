"""The dead-man's switch (``monitoring.ping_url``, healthchecks-style; docs/monitoring.md).

Every ``monitoring.ping_every`` seconds (on the gateway's clock) the gateway looks at
itself — ready and not stopping, its heartbeat runner's timers alive, its cron service's
timer alive (and its store readable), every enabled channel receiving (the channels
:class:`gateway.channels.health.ChannelHealth` reports unhealthy) — and then GETs
``ping_url`` when all is well, or ``<ping_url>/fail?reason=<why>`` when something is not
(the first problems, joined by ``; ``, at most 500 characters). A monitor that hears
nothing for a while (the process hung, the host is down) alerts by itself: that is what
makes it a dead-man's switch. A ping that fails (the monitor unreachable) is logged
(``monitoring_ping_failed``) and tried again at the next interval; it never affects the
gateway.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import structlog

log = structlog.get_logger(__name__)

REASON_MAX = 500  # characters of the reason sent with /fail


def health_problems(gw: Any) -> list[str]:
    """What is unhealthy now, one short line each ([] when all is well). ``gw`` offers
    ``ready``, ``stopping``, ``scheduling``, ``channel_health``."""
    out: list[str] = []
    if gw.stopping or not gw.ready:
        out.append("gateway: " + ("stopping" if gw.stopping else "not ready"))
    sched = gw.scheduling
    beats = getattr(sched.heartbeat, "_states", {})
    dead = [a for a, st in beats.items() if st.task is not None and st.task.done()]
    if dead:
        out.append(f"heartbeat: the timer of agent(s) {', '.join(sorted(dead))} stopped")
    cron = sched.cron
    if cron is None and getattr(sched, "cron_problem", None):
        out.append(f"cron: {sched.cron_problem}")
    elif cron is not None and (cron._task is None or cron._task.done()):
        out.append("cron: its timer is not running")
    out += [f"channel {key}: not receiving" for key in gw.channel_health.unhealthy()]
    return out


class DeadMansSwitch:
    """A gateway service (``start``/``stop``) pinging ``gw.config.monitoring.ping_url``;
    does nothing when it is not set. ``pings``/``fails``/``errors`` count what it sent."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.pings = self.fails = self.errors = 0
        self.last: dict[str, Any] | None = None  # {"ok", "reason", "status"} of the last ping
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self.gw.config.monitoring.ping_url:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        import aiohttp  # loads only when a ping URL is configured
        async with aiohttp.ClientSession() as session:
            while True:
                cfg = self.gw.config.monitoring  # a reload applies at the next ping
                await self.gw.clock.sleep(cfg.ping_every)
                if cfg.ping_url:
                    await self.ping_once(session, cfg.ping_url, cfg.ping_timeout)

    async def ping_once(self, session: Any, url: str, timeout: float) -> None:
        """One check and one GET (see the module docstring). Never raises but for
        cancellation."""
        problems = health_problems(self.gw)
        reason = "; ".join(problems)[:REASON_MAX]
        target = f"{url}/fail?reason={quote(reason)}" if problems else url
        import aiohttp
        try:
            async with session.get(target, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                status = r.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.errors += 1
            # (the URL is a credential of the monitor: never logged)
            log.warning("monitoring_ping_failed", error=type(exc).__name__,
                        health="fail" if problems else "ok")
            return
        self.fails += bool(problems)
        self.pings += not problems
        self.last = {"ok": not problems, "reason": reason or None, "status": status}
        if problems:
            log.warning("monitoring_ping_fail_sent", reason=reason, status=status)
        else:
            log.debug("monitoring_ping_sent", status=status)

    def status(self) -> dict[str, Any]:
        return {"enabled": self._task is not None, "pings": self.pings, "fails": self.fails,
                "errors": self.errors, "last": self.last}
