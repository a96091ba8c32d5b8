"""Channel health: a channel that cannot receive must not hide (issue 8 item 10).

Adapters retry forever on their own (backoff, state ``reconnecting``), which is right for
a blip and wrong for a permanent fault such as a second process polling with the same
Telegram bot token (409 on every ``getUpdates``). :class:`ChannelHealth` watches every
channel's ``status()``: one that is not ``connected`` for longer than its account's
``channels.<platform>.unhealthy_after`` (seconds, default 120) is reported once — an
ERROR ``channel_unhealthy`` with the channel, its state, the last error and the likely
cause — and listed by :meth:`problems` (in ``status.problems``, the duration and last
error as of the moment it is asked, not frozen at the report) and :meth:`unhealthy` (which
makes ``/readyz`` answer 503 naming it; ``/healthz`` stays 200: the process is live). Under
systemd the ``STATUS=`` line says the gateway is degraded and why; watchdog pings go on
(a restart cannot fix another poller or a revoked token, and a restart loop would hide the
cause). Recovery is logged (``channel_recovered``) and clears the problem.
"""

from __future__ import annotations

import asyncio
import functools
import re
from typing import Any

import structlog

from channels.sections import account_configs
from runtime.clock import Clock, format_elapsed

log = structlog.get_logger(__name__)

DEFAULT_UNHEALTHY_AFTER = 120.0
_RECEIVING = frozenset({"connected"})
_NOT_WATCHED = frozenset({"disabled", "stopped"})

# (channel or None for any, pattern over the last error, likely cause)
@functools.cache  # compiled by the first channel that goes down (issue 9, cold start)
def _causes() -> tuple[tuple[str | None, re.Pattern[str], str], ...]:
    return (
        ("telegram", re.compile(r"conflict|409|other getupdates", re.IGNORECASE),
         "another process polls with this bot token (stop it, or delete its webhook)"),
        ("email", re.compile(r"login refused", re.IGNORECASE),
         ("the IMAP server refused the login (check channels.email.imap_username and "
          "imap_password; many providers need an app password)")),
        ("telegram", re.compile(r"webhook", re.IGNORECASE),
         "a webhook is set for this bot token while tidegate polls (or the reverse)"),
        (None, re.compile(r"401|403|404|unauthori[sz]ed|invalid[_ ]auth|token|4004", re.IGNORECASE),
         "the token was rejected (check channels.<platform>.token)"),
        (None, re.compile(r"429|rate.?limit|too many requests", re.IGNORECASE),
         "the platform is rate-limiting this bot"),
        (None, re.compile(r"connect|refused|resolve|timed? ?out|network|unreachable|ssl",
                          re.IGNORECASE),
         "the platform API cannot be reached (network, proxy or api_base_url)"),
        (None, re.compile(r"5\d\d|bad gateway|unavailable|internal server", re.IGNORECASE),
         "the platform is having an outage (5xx)"),
    )


def likely_cause(channel: str, state: str, last_error: str | None) -> str:
    """A short human guess at why ``channel`` cannot receive, from its last error."""
    text = last_error or ""
    for only, pattern, cause in _causes():
        if (only is None or only == channel) and pattern.search(text):
            return cause
    if state == "failed":
        return "the adapter gave up (see its last error)"
    return "unknown (see last_error and the channel's log lines)"


class ChannelHealth:
    """Watches ``gw.channels`` on ``clock`` every ``interval`` seconds (default: a quarter
    of the smallest ``unhealthy_after``, between 0.25 and 5 s). A gateway service:
    ``await start()``, ``await stop()``."""

    def __init__(self, gw: Any, clock: Clock, interval: float | None = None) -> None:
        self.gw = gw
        self.clock = clock
        self.interval = interval
        self._down_since: dict[str, float] = {}
        self._reported: dict[str, dict[str, Any]] = {}  # channel key -> state, last_error
        self._causes: dict[str, str] = {}  # channel key -> likely cause
        self._task: asyncio.Task | None = None

    # -- service ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                self.check()
            except Exception:  # a status() bug must not end the watch
                log.exception("channel_health_check_failed")
            await self.clock.sleep(self._interval())

    def _interval(self) -> float:
        if self.interval is not None:
            return self.interval
        limits = [self._limit(ch) for ch in self.gw.channels] or [DEFAULT_UNHEALTHY_AFTER]
        return min(5.0, max(0.25, min(limits) / 4))

    # -- checks ----------------------------------------------------------------------------
    def unhealthy(self) -> list[str]:
        """Channel keys (``telegram`` or ``telegram:<account>``) reported unhealthy now."""
        return sorted(self._reported)

    def problems(self) -> list[str]:
        """One line per unhealthy channel, its down time counted up to now."""
        now = self.clock.time()
        return [f"channel {key} cannot receive (state {r['state']} for "
                f"{format_elapsed(now - self._down_since.get(key, now))}): "
                f"{self._causes.get(key, 'unknown')}; last error: {r['last_error'] or 'none recorded'}"
                for key, r in sorted(self._reported.items())]

    def check(self) -> None:
        """Look at every channel once (called by the loop; tests may call it directly)."""
        now = self.clock.time()
        for ch in self.gw.channels:
            key = ch.name if ch.account_id == "default" else f"{ch.name}:{ch.account_id}"
            try:
                st = ch.status()
            except Exception as exc:  # noqa: BLE001 - a raising status() is a failed channel
                st = {"state": "failed", "last_error": f"status() raised {exc!r}"}
            state = str(st.get("state"))
            if state in _RECEIVING or state in _NOT_WATCHED:
                self._down_since.pop(key, None)
                if key in self._reported:
                    self._recovered(key, state)
                continue
            since = self._down_since.setdefault(key, now)
            if key in self._reported:  # still down: keep what problems() shows current
                self._reported[key] = {"state": state, "last_error": st.get("last_error")}
            elif now - since >= self._limit(ch):
                self._report(key, ch.name, state, st.get("last_error"), now - since)

    def _limit(self, ch: Any) -> float:
        section = getattr(self.gw.config.channels, ch.name, None)
        acc = account_configs(section).get(ch.account_id) if section is not None else None
        return float(getattr(acc, "unhealthy_after", DEFAULT_UNHEALTHY_AFTER))

    def _report(self, key: str, name: str, state: str, last_error: Any, down: float) -> None:
        cause = likely_cause(name, state, str(last_error) if last_error else None)
        self._reported[key] = {"state": state, "last_error": last_error}
        self._causes[key] = cause
        log.error("channel_unhealthy", channel=key, state=state, down_s=round(down, 1),
                  last_error=last_error, likely_cause=cause)
        self._notify()

    def _recovered(self, key: str, state: str) -> None:
        self._reported.pop(key)
        self._causes.pop(key, None)
        log.info("channel_recovered", channel=key, state=state)
        self._notify()

    def _notify(self) -> None:
        notifier = getattr(self.gw, "notifier", None)
        if notifier is None:
            return
        if self._causes:
            notifier.notify("STATUS=degraded: " + "; ".join(
                f"{key} cannot receive ({cause})" for key, cause in self._causes.items()))
        else:
            notifier.notify(f"STATUS=serving on port {self.gw.port}")
