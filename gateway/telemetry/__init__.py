"""The gateway's side of ``telemetry``: the service that starts the OpenTelemetry SDK
(``runtime/telemetry/setup.py``) when ``telemetry.otlp.endpoint`` is set, exports the
/metrics metrics every ``metrics_interval`` (``metrics.py``) and flushes both at stop."""

from gateway.telemetry.service import Telemetry

__all__ = ["Telemetry"]
