"""The text exposition of ``/metrics``: the counted families (``counting``) become
prometheus-client metric families at scrape time, next to gauges read from the gateway,
and prometheus-client writes the text format. Imported at the first scrape only (the
package import costs ~20 ms of a cold start, issue 9)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import metrics as client_metrics
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from gateway.server.metrics.counting import Counter, Histogram


def registry(families: Iterable[Counter | Histogram], gw: Any) -> CollectorRegistry:
    """A registry of the counted ``families`` (in order), then the gateway's gauges."""
    reg = CollectorRegistry(auto_describe=True)
    reg.register(_CountedCollector(tuple(families)))
    reg.register(_LiveCollector(gw))
    return reg


def render(reg: CollectorRegistry) -> bytes:
    """Prometheus text format 0.0.4 (``routes.CONTENT_TYPE``)."""
    return generate_latest(reg)


def _created() -> bool:
    """prometheus-client's own switch for ``_created`` series
    (PROMETHEUS_DISABLE_CREATED_SERIES, ``disable_created_metrics()``)."""
    return client_metrics._use_created


def counter_family(c: Counter, created: bool) -> Metric:
    fam = CounterMetricFamily(c.name, c.documentation, labels=c.labelnames)
    for labels, value in c.values.items():
        fam.add_metric(labels, value, created=c.created[labels] if created else None)
    return fam


def histogram_family(h: Histogram, created: bool) -> Metric:
    """Cumulative buckets, ``_count``, ``_sum`` and ``_created`` per series, as
    prometheus-client's ``Histogram`` has them."""
    fam = HistogramMetricFamily(h.name, h.documentation, labels=h.labelnames)
    les = [floatToGoString(b) for b in h.bounds]
    for labels, series in h.series.items():
        acc, buckets = 0.0, []
        for le, n in zip(les, series.counts):
            acc += n
            buckets.append((le, acc))
        fam.add_metric(labels, buckets, series.sum)
        if created:  # HistogramMetricFamily.add_metric has no ``created``
            fam.samples.append(Sample(h.name + "_created", dict(zip(h.labelnames, labels)),
                                      series.created))
    return fam


class _CountedCollector:
    def __init__(self, families: tuple[Counter | Histogram, ...]) -> None:
        self.families = families

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        created = _created()
        for fam in self.families:
            if isinstance(fam, Counter):
                yield counter_family(fam, created)
            else:
                yield histogram_family(fam, created)


class _LiveCollector:
    """Gauges read from the gateway at scrape time."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        gw = self.gw
        stats = gw.lanes.stats()
        yield GaugeMetricFamily("tidegate_lane_queue_depth", "Queued lane items",
                                value=stats.get("queued", 0))
        active = GaugeMetricFamily("tidegate_lanes_active", "Running turns by lane kind",
                                   labels=["kind"])
        for kind in stats.get("caps", {}):
            active.add_metric([kind], stats.get("running", {}).get(kind, 0))
        yield active
        connected = GaugeMetricFamily("tidegate_channel_connected",
                                      "1 when the channel is connected", labels=["channel"])
        reconnects = CounterMetricFamily("tidegate_channel_reconnects",
                                         "Reconnects reported by the adapter",
                                         labels=["channel"])
        for name, st in gw.channel_status().items():
            if st.get("state") == "disabled":
                continue
            connected.add_metric([name], 1.0 if st.get("state") == "connected" else 0.0)
            reconnects.add_metric([name], float(st.get("reconnects") or 0))
        yield connected
        yield reconnects
        yield GaugeMetricFamily("tidegate_outbox_depth", "Replies waiting in the outbox",
                                value=gw.outbox.pending())
        from gateway.journal.recorder import outcome_status
        out = outcome_status(gw)
        yield GaugeMetricFamily("tidegate_messages_without_outcome",
                                "Accepted messages with no outcome, older than the turn "
                                "timeout and neither queued nor running in a lane (a bug "
                                "when not 0)", value=out["unresolved"])
        yield GaugeMetricFamily("tidegate_dead_letters", "Messages set aside (dead letters)",
                                value=out["dead_letters"])
        yield from _backup_gauges(gw)


def _backup_gauges(gw: Any) -> Iterator[Metric]:
    """The last backup (``backup-last.json``): its time, age and result; none before the
    first backup; only ``..._last_success 0`` when the record cannot be used."""
    from gateway.backup.service import load_last
    last, problem = load_last(gw.state_dir)
    if problem:
        yield _success_gauge(0.0)
        return
    if not last:
        return
    at = float(last["at"])
    yield GaugeMetricFamily("tidegate_backup_last_timestamp_seconds",
                            "When the last backup ran (epoch seconds)", value=at)
    yield GaugeMetricFamily("tidegate_backup_last_age_seconds",
                            "Seconds since the last backup ran", value=gw.clock.time() - at)
    yield _success_gauge(1.0 if last.get("ok") else 0.0)


def _success_gauge(value: float) -> Metric:
    return GaugeMetricFamily("tidegate_backup_last_success",
                             "1 when the last backup succeeded, 0 when it failed (or its "
                             "record backup-last.json cannot be read)", value=value)
