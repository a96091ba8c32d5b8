"""The gateway's counters and histograms, counted in plain dicts keyed by label values
(no prometheus-client at start, issue 9); ``exposition`` renders them when scraped.

Semantics are prometheus-client's ``Counter`` and ``Histogram``: a series (one tuple of
label values) is created on first use and stamped with its ``_created`` time (epoch
seconds, ``time.time()``); histogram buckets are upper bounds, ``+Inf`` is added; an
unlabelled histogram has its one series from the start. Fed on the event loop only, so no
lock (prometheus-client locks every increment)."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence

INF = float("inf")


class Counter:
    """A counter family. ``name`` is without ``_total``; ``values`` and ``created`` map a
    tuple of label values (in ``labelnames`` order) to the total and the series' creation
    time, in first-use order (the exposition order)."""

    __slots__ = ("created", "documentation", "labelnames", "name", "values")

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {}
        self.created: dict[tuple[str, ...], float] = {}

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        """Add ``amount`` to the series ``labels``. Raises ValueError for a negative
        amount (a counter only goes up)."""
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        value = self.values.get(labels)
        if value is None:
            self.created[labels] = time.time()
            value = 0.0
        self.values[labels] = value + amount


class Series:
    """One histogram series: observations per bucket (not cumulative), their sum, and the
    creation time (epoch s)."""

    __slots__ = ("counts", "created", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets
        self.sum = 0.0
        self.created = time.time()


class Histogram:
    """A histogram family: ``bounds`` are the bucket upper bounds (ending with ``+Inf``),
    ``series`` maps a tuple of label values to its ``Series``, in first-use order."""

    __slots__ = ("bounds", "documentation", "labelnames", "name", "series")

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 buckets: Sequence[float]) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(bounds)
        self.series: dict[tuple[str, ...], Series] = {}
        if not self.labelnames:
            self.series[()] = Series(len(bounds))

    def observe(self, labels: tuple[str, ...], amount: float) -> None:
        """Count ``amount`` (seconds, for ours) in the series ``labels``."""
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = Series(len(self.bounds))
        series.sum += amount
        i = bisect_left(self.bounds, amount)
        if amount <= self.bounds[i]:  # False only for NaN: no bucket, as prometheus-client
            series.counts[i] += 1
