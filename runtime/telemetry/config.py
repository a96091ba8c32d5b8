"""The ``telemetry`` config section: OpenTelemetry export of turn traces and metrics.

Off by default: without ``telemetry.otlp.endpoint`` nothing of OpenTelemetry is imported
and every tracing hook is one ``None`` check (``runtime/telemetry/spans.py``).
"""

from typing import Literal

from pydantic import Field, field_validator

from runtime.config_types import ConfigModel, Duration, section


class OtlpSettings(ConfigModel):
    endpoint: str | None = Field(
        None, description="the OTLP receiver: http/protobuf a base URL such as "
        "http://collector:4318 (/v1/traces and /v1/metrics are appended), grpc host:port "
        "such as http://collector:4317; unset = telemetry off")
    protocol: Literal["http/protobuf", "grpc"] = Field(
        "http/protobuf", description="OTLP transport: http/protobuf | grpc")
    headers: dict[str, str] = Field(
        {}, description="extra headers (HTTP) or metadata (gRPC) on every export, e.g. "
        "an API key as ${OTEL_TOKEN}; never logged")
    sample_ratio: float = Field(
        1.0, ge=0.0, le=1.0, description="share of turns traced (0..1, by trace id)")
    interval: Duration = Field(
        5.0, gt=0, description="seconds finished spans wait at most before they are sent "
        "(in batches)")
    metrics_interval: Duration = Field(
        60.0, gt=0, description="seconds between two exports of the /metrics metrics "
        "(and one at shutdown)")
    timeout: Duration = Field(10.0, gt=0, description="seconds one export may take")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        v = (v or "").strip()
        if not v:
            return None
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {v!r}")
        return v.rstrip("/")


class TelemetrySection(ConfigModel):
    otlp: OtlpSettings = Field(
        section(), description="Where traces and metrics go (OTLP); off unless endpoint "
        "is set.")
    include_content: bool = Field(
        False, description="also put message text, tool arguments and session keys in "
        "span attributes (off: only names, counts, timings and outcomes)")
    service_name: str = Field("tidegate", description="the service.name resource "
                              "attribute of every span and metric")
