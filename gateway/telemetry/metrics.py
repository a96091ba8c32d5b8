"""The /metrics metrics as OTLP metrics: every family of the gateway's prometheus
registry (``gateway/server/metrics``) read at export time and converted, same names and
labels (as attributes):

- counters -> cumulative monotonic sums (the family name, without ``_total``),
- gauges -> gauges,
- histograms -> cumulative explicit-bucket histograms (prometheus' cumulative buckets
  turned into per-bucket counts; min and max are unknown and left unset).

``_created`` samples give the series' start time; other series start at the process
start. Summaries and untyped families (none today) are skipped.
"""

from __future__ import annotations

import math
import time
from typing import Any

_STARTED_NS = time.time_ns()


def metrics_data(registry: Any, resource: Any) -> Any:
    """An SDK ``MetricsData`` of everything ``registry`` (prometheus-client
    ``CollectorRegistry``) reports now."""
    from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    now = time.time_ns()
    out = [m for fam in registry.collect() if (m := _metric(fam, now)) is not None]
    scope = ScopeMetrics(InstrumentationScope("tidegate.metrics"), out, "")
    return MetricsData([ResourceMetrics(resource, [scope], "")])


def _start(created: dict[tuple, float], attrs: dict[str, str]) -> int:
    at = created.get(tuple(sorted(attrs.items())))
    return int(at * 1e9) if at else _STARTED_NS


def _metric(fam: Any, now: int) -> Any:
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Metric,
        NumberDataPoint,
        Sum,
    )
    created = {tuple(sorted(s.labels.items())): s.value for s in fam.samples
               if s.name.endswith("_created")}
    if fam.type == "counter":
        points = [NumberDataPoint(dict(s.labels), _start(created, s.labels), now, s.value)
                  for s in fam.samples if s.name.endswith("_total")]
        data: Any = Sum(points, AggregationTemporality.CUMULATIVE, True)
    elif fam.type == "gauge":
        data = Gauge([NumberDataPoint(dict(s.labels), _STARTED_NS, now, s.value)
                      for s in fam.samples])
    elif fam.type == "histogram":
        data = _histogram(fam, created, now)
    else:
        return None
    if not data.data_points:  # a family without series yet: OTLP has no empty metric
        return None
    return Metric(fam.name, fam.documentation, fam.unit or "", data)


def _histogram(fam: Any, created: dict[tuple, float], now: int) -> Any:
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Histogram,
        HistogramDataPoint,
    )
    series: dict[tuple, dict[str, Any]] = {}
    for s in fam.samples:
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        one = series.setdefault(tuple(sorted(labels.items())),
                                {"attrs": labels, "buckets": [], "count": 0, "sum": 0.0})
        if s.name.endswith("_bucket"):
            one["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_count"):
            one["count"] = int(s.value)
        elif s.name.endswith("_sum"):
            one["sum"] = s.value
    points = []
    for one in series.values():
        cum = sorted(one["buckets"])
        counts = [int(c - (cum[i - 1][1] if i else 0)) for i, (_, c) in enumerate(cum)]
        bounds = [le for le, _ in cum if not math.isinf(le)]
        points.append(HistogramDataPoint(one["attrs"], _start(created, one["attrs"]), now,
                                         one["count"], one["sum"], counts, bounds,
                                         None, None))  # type: ignore[arg-type]
    return Histogram(points, AggregationTemporality.CUMULATIVE)
