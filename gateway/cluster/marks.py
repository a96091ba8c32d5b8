"""The started/done journal marks of a replica's work rows, batched (issue 15
"Replicas"; gateway/cluster/journal.py): marks made while a flush is writing wait for the
next one, and every flush writes each kind with one fenced statement
(:func:`gateway.cluster.fencing.write_marks`), waiting out a PostgreSQL outage."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.cluster.db import ClusterDB
from gateway.cluster.fencing import write_marks


class JournalMarks:
    """``mark("started" | "done", row ids)`` -> a future set once the mark is committed
    (awaiting it is optional) to the ids of those rows the mark was refused for (fenced:
    no longer this replica's, taken over; ``[]`` when none); ``spawn`` runs the flush in
    the background (the owner's task set, awaited at its close)."""

    def __init__(self, db: ClusterDB, replica: str,
                 spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self.db, self.me, self._spawn = db, replica, spawn
        self._marks: dict[str, set[int]] = {"started": set(), "done": set()}
        self._runs: dict[int, str] = {}  # row id -> run id of its pending started mark
        # (future, row ids) of the marks not yet written
        self._waiting: list[tuple[asyncio.Future, set[int]]] = []
        self._flushing = False

    def mark(self, kind: str, ids: list[int], run: str | None = None) -> asyncio.Future:
        """``run``: the turn a ``started`` mark's rows run in (kept as their run id)."""
        self._marks[kind].update(ids)
        if run is not None:
            self._runs.update(dict.fromkeys(ids, run))
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append((fut, set(ids)))
        if not self._flushing:
            self._flushing = True
            self._spawn(self._flush())
        return fut

    async def _flush(self) -> None:
        waiting: list[tuple[asyncio.Future, set[int]]] = []
        try:
            while any(self._marks.values()):
                batch = {k: list(v) for k, v in self._marks.items()}
                runs, self._runs = self._runs, {}
                for v in self._marks.values():
                    v.clear()
                waiting, self._waiting = self._waiting, []
                refused = await self.db.retry(
                    lambda c, b=batch, r=runs: write_marks(c, b, self.me, r),
                    what="journal marks")
                for fut, ids in waiting:
                    if not fut.done():
                        fut.set_result(sorted(ids & refused))
        finally:
            self._flushing = False
            for fut, _ids in waiting + self._waiting:  # cancelled (shutdown): nobody
                if not fut.done():  # waits on
                    fut.cancel()
            self._waiting = []
