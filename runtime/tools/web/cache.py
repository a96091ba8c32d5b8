"""A small TTL cache for web results (15 minutes by default, issue 12), on the injected
clock so expiry is tested without sleeping."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from runtime.clock import Clock


class TTLCache:
    """``get(key)`` -> value or None; ``put(key, value)``. Oldest entries go first past
    ``max_entries``; entries older than ``ttl`` seconds (clock.monotonic) are misses."""

    def __init__(self, clock: Clock, ttl: float, max_entries: int = 256) -> None:
        self.clock, self.ttl, self.max_entries = clock, ttl, max_entries
        self._data: OrderedDict[Any, tuple[float, Any]] = OrderedDict()

    def get(self, key: Any) -> Any:
        hit = self._data.get(key)
        if hit is None:
            return None
        if self.clock.monotonic() - hit[0] > self.ttl:
            del self._data[key]
            return None
        return hit[1]

    def put(self, key: Any, value: Any) -> None:
        if self.ttl <= 0:
            return
        self._data[key] = (self.clock.monotonic(), value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)
