"""The OpenTelemetry SDK behind ``telemetry.otlp``: a tracer provider with the OTLP span
exporter (http/protobuf or grpc) in a batch processor, parent-based sampling by
``sample_ratio``, and the OTLP metric exporter the gateway feeds its /metrics metrics to.
Imported only when tracing is on (the SDK costs ~100 ms of imports)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.telemetry.config import TelemetrySection
from runtime.telemetry.spans import Tracing, install
from runtime.telemetry.watch import WatchedExporter


@dataclass(slots=True)
class Exporting:
    """What :func:`start` set up: the tracer ``provider``, the ``metric_exporter`` (OTLP
    ``MetricExporter``) and the ``resource`` metrics are reported under."""

    provider: Any
    metric_exporter: Any
    resource: Any

    def shutdown(self) -> None:
        """Send what is buffered, stop the exporters and uninstall the hooks."""
        install(None)
        self.provider.shutdown()
        self.metric_exporter.shutdown()


def _exporters(cfg: TelemetrySection) -> tuple[Any, Any]:
    otlp = cfg.otlp
    headers = dict(otlp.headers)
    if otlp.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        insecure = otlp.endpoint.startswith("http://")
        meta = tuple((k.lower(), v) for k, v in headers.items()) or None
        return (OTLPSpanExporter(endpoint=otlp.endpoint, insecure=insecure, headers=meta,
                                 timeout=otlp.timeout),
                OTLPMetricExporter(endpoint=otlp.endpoint, insecure=insecure, headers=meta,
                                   timeout=otlp.timeout))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return (OTLPSpanExporter(endpoint=f"{otlp.endpoint}/v1/traces", headers=headers,
                             timeout=otlp.timeout),
            OTLPMetricExporter(endpoint=f"{otlp.endpoint}/v1/metrics", headers=headers,
                               timeout=otlp.timeout))


def start(cfg: TelemetrySection, *, version: str, instance: str) -> Exporting:
    """Build the SDK for ``cfg`` (endpoint set) and install the tracing hooks. The
    exporters connect lazily: an unreachable receiver costs dropped spans (the SDK logs
    a warning), never a turn."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    resource = Resource.create({"service.name": cfg.service_name,
                                "service.version": version,
                                "service.instance.id": instance})
    # shutdown_on_exit off: the gateway shuts it down itself, within a bound
    # (gateway/telemetry/service.py); the SDK's atexit hook could wait 30 s on a hung
    # receiver after that bound gave up
    provider = TracerProvider(resource=resource, shutdown_on_exit=False,
                              sampler=ParentBased(TraceIdRatioBased(cfg.otlp.sample_ratio)))
    spans, metrics = _exporters(cfg)
    provider.add_span_processor(BatchSpanProcessor(
        WatchedExporter(spans, cfg.otlp.endpoint), schedule_delay_millis=cfg.otlp.interval * 1000,
        export_timeout_millis=cfg.otlp.timeout * 1000))
    tracer = provider.get_tracer("tidegate", version)
    install(Tracing(tracer, include_content=cfg.include_content))
    return Exporting(provider, metrics, resource)
