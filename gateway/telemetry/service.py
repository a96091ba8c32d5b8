"""``Telemetry``: one of the gateway's extra services (start/stop with the daemon).

Off (no ``telemetry.otlp.endpoint``) ``start`` returns at once and nothing of
OpenTelemetry is imported. On, it installs the tracing hooks, then exports the /metrics
metrics every ``telemetry.otlp.metrics_interval`` seconds (real time: the receiver's
clock, not the gateway's injectable one) and once more at :meth:`Telemetry.close`, which
the daemon calls after the lanes drained (so the last turns' spans are sent too).
An export that fails is logged once per failure streak and never stops the gateway.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import structlog

log = structlog.get_logger(__name__)


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
        await asyncio.to_thread(self._final)
        self.exporting = None

    def _final(self) -> None:
        exporting = self.exporting
        exporting.provider.force_flush()
        self.export_metrics()
        exporting.shutdown()

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
