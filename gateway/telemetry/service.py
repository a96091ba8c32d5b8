"""``Telemetry``: one of the gateway's extra services (start/stop with the daemon).

Off (no ``telemetry.otlp.endpoint``) ``start`` returns at once and nothing of
OpenTelemetry is imported. On, it installs the tracing hooks, then exports the /metrics
metrics every ``telemetry.otlp.metrics_interval`` seconds (real time: the receiver's
clock, not the gateway's injectable one) and once more at :meth:`Telemetry.close`, which
the daemon calls after the lanes drained (so the last turns' spans are sent too).
An export that fails is logged once per failure streak and never stops the gateway.
:meth:`Telemetry.close` takes at most :data:`CLOSE_TIMEOUT_S` of the gateway clock: a
receiver that accepts connections but never answers would otherwise hold the stop for
the export timeout of every span batch and the metrics; what is not sent by then is
dropped (one warning says so).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Any

import structlog

log = structlog.get_logger(__name__)
CLOSE_TIMEOUT_S = 2.0  # the last spans and metrics at shutdown, all exports together


class Telemetry:
    """``gw``: the gateway (its ``config.telemetry``, ``metrics`` and version)."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.exporting: Any = None
        self.exports = 0  # metric exports done (tests, status)
        self._task: asyncio.Task | None = None
        self._failing = False

    @property
    def enabled(self) -> bool:
        return self.exporting is not None

    async def start(self) -> None:
        cfg = self.gw.config.telemetry
        if not cfg.otlp.endpoint or self.exporting is not None:
            return
        from runtime.telemetry.setup import start
        version = _version()
        self.exporting = start(cfg, version=version,
                               instance=f"{socket.gethostname()}:{os.getpid()}")
        log.info("telemetry_started", endpoint=cfg.otlp.endpoint, protocol=cfg.otlp.protocol,
                 sample_ratio=cfg.otlp.sample_ratio, include_content=cfg.include_content)
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop the periodic metric export (with the other services); the SDK stays up
        for the turns still draining until :meth:`close`."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def close(self) -> None:
        """After the lanes drained: send the last spans and the metrics once more, then
        shut the exporters down."""
        await self.stop()
        if self.exporting is None:
            return
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        # a daemon thread, not the default executor: one stuck on a hung receiver must
        # not hold the process exit (the SDK's own flush ignores its timeout)
        threading.Thread(target=self._final, args=(loop, done), daemon=True,
                         name="telemetry-close").start()
        try:
            async with self.gw.clock.timeout(CLOSE_TIMEOUT_S):
                await asyncio.shield(done)
        except TimeoutError:
            from runtime.telemetry.spans import install
            install(None)  # the stuck thread may never get that far
            log.warning("telemetry_close_timed_out", endpoint=self.gw.config.telemetry
                        .otlp.endpoint, wait_s=CLOSE_TIMEOUT_S,
                        effect="the spans and metrics not sent yet are dropped")
        self.exporting = None

    def _final(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future) -> None:
        """Flush, export the metrics, shut down (blocking); then resolve ``done``."""
        exporting = self.exporting
        try:
            exporting.provider.force_flush()
            self.export_metrics()
            exporting.shutdown()
        except Exception:  # shutting down: log, never raise
            log.exception("telemetry_close_failed")
        finally:
            try:
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))
            except RuntimeError:  # the loop is gone: the bound gave up long ago
                pass

    async def _loop(self) -> None:
        every = self.gw.config.telemetry.otlp.metrics_interval
        while True:
            await asyncio.sleep(every)
            await asyncio.to_thread(self.export_metrics)

    def export_metrics(self) -> bool:
        """Send the /metrics metrics now (blocking; False when the export failed)."""
        from gateway.telemetry.metrics import metrics_data
        exporting = self.exporting
        if exporting is None:
            return False
        try:
            data = metrics_data(self.gw.metrics.registry(), exporting.resource)
            ok = exporting.metric_exporter.export(data).name == "SUCCESS"
        except Exception as exc:  # noqa: BLE001 - an export never stops the gateway
            ok = False
            log.warning("telemetry_metrics_failed", error=f"{type(exc).__name__}: {exc}")
        if not ok and not self._failing:
            log.warning("telemetry_metrics_export_failed",
                        endpoint=self.gw.config.telemetry.otlp.endpoint)
        self._failing = not ok
        self.exports += ok
        return ok


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("tidegate")
    except Exception:  # noqa: BLE001
        return "0.0.0"
