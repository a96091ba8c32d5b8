"""systemd notify: sd_notify states and the watchdog loop (sd_notify(3)).

The notify protocol is a datagram of newline-separated ``KEY=VALUE`` states sent to the
``AF_UNIX`` socket named by ``$NOTIFY_SOCKET`` — a path, or ``@name`` for the abstract
namespace — so it needs no dependency. With ``Type=notify`` systemd waits for
``READY=1``; ``STOPPING=1`` announces the drain; with ``WatchdogSec=`` it expects
``WATCHDOG=1`` at least every ``$WATCHDOG_USEC`` microseconds and restarts a service that
goes quiet (systemd.service(5), sd_watchdog_enabled(3)). DESIGN.md "Operations". The unit
file and its installer: gateway/service/unit.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog

from runtime.clock import Clock

log = structlog.get_logger(__name__)


@dataclass
class SystemdNotifier:
    """Sends sd_notify states; every method is a no-op when ``address`` is None.

    ``address``: a filesystem path, or ``"\\0name"`` for an abstract socket (from
    ``@name``). ``watchdog_usec``: the watchdog period systemd expects pings within, in
    microseconds (None = no watchdog for us).
    """

    address: str | None = None
    watchdog_usec: int | None = None
    _sock: socket.socket | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 pid: int | None = None) -> SystemdNotifier:
        """Read ``$NOTIFY_SOCKET``, ``$WATCHDOG_USEC`` and ``$WATCHDOG_PID``.

        The watchdog is ours only when ``WATCHDOG_USEC`` is a positive integer and
        ``WATCHDOG_PID`` is unset or equals ``pid`` (default ``os.getpid()``). An
        unsupported address (e.g. ``vsock:``) is logged and treated as unset.
        """
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET") or None
        address: str | None = None
        if raw:
            if raw.startswith("@"):
                address = "\0" + raw[1:]
            elif raw.startswith("/"):
                address = raw
            else:
                log.warning("notify_socket_unsupported", notify_socket=raw)
        usec: int | None = None
        try:
            usec = int(env.get("WATCHDOG_USEC", "")) or None
        except ValueError:
            usec = None
        if usec is not None and usec < 0:
            usec = None
        wd_pid = env.get("WATCHDOG_PID")
        if usec is not None and wd_pid:
            try:
                if int(wd_pid) != (os.getpid() if pid is None else pid):
                    usec = None
            except ValueError:
                usec = None
        return cls(address=address, watchdog_usec=usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def watchdog_interval(self) -> float | None:
        """Seconds between ``WATCHDOG=1`` pings: half the systemd period (the
        sd_watchdog_enabled(3) advice), or None when the watchdog is off or not ours."""
        if self.watchdog_usec is None or not self.enabled:
            return None
        return self.watchdog_usec / 2 / 1_000_000

    def notify(self, *states: str) -> bool:
        """Send ``states`` (e.g. ``"READY=1", "STATUS=serving"``) in one datagram.

        Returns True when sent, False when disabled or the send failed (logged, never
        raised: a lost notification must not take the gateway down). Raises ValueError for
        an empty call or a state containing a newline.
        """
        if not states or any("\n" in s for s in states):
            raise ValueError("notify() needs one or more single-line KEY=VALUE states")
        if self.address is None:
            return False
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                sock.settimeout(1.0)  # a full receive queue must not hang the event loop
                self._sock = sock
            self._sock.sendto("\n".join(states).encode(), self.address)
            return True
        except OSError as exc:
            log.warning("sd_notify_failed", states=list(states), error=str(exc))
            return False

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


async def watchdog_loop(notifier: SystemdNotifier, clock: Clock, stop_event: asyncio.Event,
                        healthy: Callable[[], bool] = lambda: True) -> None:
    """Send ``WATCHDOG=1`` every :meth:`SystemdNotifier.watchdog_interval` seconds (of
    ``clock``) while ``healthy()`` is true, until ``stop_event`` is set.

    Runs on the event loop on purpose: a wedged loop stops the pings and systemd restarts
    the service. An unhealthy (or raising) check skips the ping, so a gateway stuck in a
    bad state is restarted too. Returns at once when there is no watchdog.
    """
    interval = notifier.watchdog_interval()
    if interval is None:
        return
    was_healthy = True
    while not stop_event.is_set():
        try:
            ok = bool(healthy())
        except Exception as exc:  # noqa: BLE001 - a broken probe means unhealthy, not a crash
            log.warning("watchdog_health_check_failed", error=repr(exc))
            ok = False
        if ok:
            notifier.notify("WATCHDOG=1")
        elif was_healthy:
            log.warning("watchdog_ping_withheld", reason="unhealthy")
        was_healthy = ok
        try:
            async with clock.timeout(interval):
                await stop_event.wait()
        except TimeoutError:
            pass
