"""A span exporter that reports an outage of the OTLP receiver once: the SDK's own
exporters log a warning for each retry and an error for each dropped batch (their
loggers are held back in gateway/logs/pipeline.py ``QUIET_LOGGERS``), so this wrapper
logs one ``telemetry_spans_export_failed`` warning when exports start failing and one
``telemetry_spans_export_recovered`` when they work again. Imported only when tracing
is on (it subclasses the SDK's ``SpanExporter``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = structlog.get_logger(__name__)


class WatchedExporter(SpanExporter):
    """``inner``: the OTLP span exporter; ``endpoint``: named in the warning. ``failing``
    is True while the last export failed."""

    def __init__(self, inner: Any, endpoint: str) -> None:
        self.inner, self.endpoint = inner, endpoint
        self.failing = False
        self.dropped = 0  # spans of failed exports during the current outage

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # noqa: BLE001 - an export never stops the gateway
            result, why = SpanExportResult.FAILURE, type(exc).__name__
        else:
            why = None
        if result is SpanExportResult.SUCCESS:
            if self.failing:
                log.info("telemetry_spans_export_recovered", endpoint=self.endpoint,
                         dropped=self.dropped)
            self.failing, self.dropped = False, 0
            return result
        self.dropped += len(spans)
        if not self.failing:
            log.warning("telemetry_spans_export_failed", endpoint=self.endpoint,
                        error=why, effect="spans are dropped until the receiver answers "
                        "(logged once per outage)")
        self.failing = True
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
