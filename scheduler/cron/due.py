"""The cron timer's queue: job ids ordered by due time (a heap with lazy deletion, so
10,000 jobs cost O(log n) per change; scheduler/cron/service.py sleeps until
:meth:`DueQueue.next_at`).
"""

from __future__ import annotations

import heapq
import itertools


class DueQueue:
    """Each job id is due at most once: :meth:`put` replaces an earlier time, :meth:`drop`
    forgets it, :meth:`pop_due` takes every id due by ``now`` (earliest first)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._live: dict[str, int] = {}  # job id -> seq of its valid heap entry
        self._seq = itertools.count()

    def put(self, job_id: str, at: float) -> None:
        seq = next(self._seq)
        self._live[job_id] = seq
        heapq.heappush(self._heap, (at, seq, job_id))
        if len(self._heap) > 2 * len(self._live) + 1024:  # drop stale entries
            self._heap = [e for e in self._heap if self._live.get(e[2]) == e[1]]
            heapq.heapify(self._heap)

    def drop(self, job_id: str) -> None:
        self._live.pop(job_id, None)

    def clear(self) -> None:
        self._heap, self._live = [], {}

    def pop_due(self, now: float) -> list[str]:
        due: list[str] = []
        while self._heap and self._heap[0][0] <= now:
            _, seq, job_id = heapq.heappop(self._heap)
            if self._live.get(job_id) == seq:
                del self._live[job_id]
                due.append(job_id)
        return due

    def next_at(self) -> float | None:
        """The earliest due time queued (possibly a stale entry's: waking early is
        harmless), or None."""
        return self._heap[0][0] if self._heap else None
