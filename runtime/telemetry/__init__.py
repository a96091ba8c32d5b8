"""Tracing of turns with OpenTelemetry (``telemetry.otlp``): the hooks on the turn path
(``spans.py``, free when off), the config section (``config.py``) and the SDK setup with
the OTLP exporters (``setup.py``, imported only when tracing is on).
"""

from runtime.telemetry.spans import (
    NOOP_SPAN,
    annotate,
    content,
    enabled,
    fail,
    inject,
    span,
    turn,
)

__all__ = ["NOOP_SPAN", "annotate", "content", "enabled", "fail", "inject", "span", "turn"]
