"""Cron job definitions shared by the replicas (issue 15 "Cron and heartbeat").

Every replica's cron service reads the same ``cron_jobs`` table. A write there NOTIFYs
``tidegate_cron`` with the writing store's origin id; the other replicas then call
``CronService.sync`` (new jobs are scheduled, removed ones stop, newer definitions
replace theirs). The cluster tick compares the table's revision too, so a notification
lost in an outage is caught up within one tick. Which replica runs a due time is still
the occurrence ledger's decision (``occurrences.CronLedger``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from runtime.storage.postgres.cron import NOTIFY_CHANNEL

log = structlog.get_logger(__name__)


class SharedJobs:
    """``SharedJobs(cron, records)``: ``on_notify`` is the LISTEN callback, ``tick`` the
    polling fallback. ``cron`` is a ``CronService`` over ``records`` (PgCronRecords)."""

    channel = NOTIFY_CHANNEL

    def __init__(self, cron: Any, records: Any) -> None:
        self.cron, self.records = cron, records
        self.seen_rev: int | None = None
        self._task: asyncio.Task | None = None
        self._again = False

    def on_notify(self, origin: str) -> None:
        if origin != self.records.origin:
            self.kick()

    def kick(self) -> None:
        """Sync soon (coalesced: one sync at a time, one more if asked meanwhile)."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._sync(), name="cron-sync")

    async def _sync(self) -> None:
        while True:
            self._again = False
            try:
                rev = await asyncio.to_thread(self.records.revision)
                await self.cron.sync()
                self.seen_rev = rev
            except (OSError, ValueError) as exc:  # an outage or a bad row: next tick
                log.warning("cron_sync_failed", error=str(exc))
            if not self._again:
                return

    async def tick(self) -> None:
        """Sync when the table moved since the last sync (a missed NOTIFY)."""
        try:
            rev = await asyncio.to_thread(self.records.revision)
        except OSError:
            return
        if rev != self.seen_rev:
            self.kick()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def shared_jobs(cron: Any, records: Any, db: Any) -> SharedJobs | None:
    """Hook ``cron`` to the other replicas' job edits when its store is shared (has a
    ``revision``); None for a store of this replica's own."""
    if not hasattr(records, "revision"):
        return None
    jobs = SharedJobs(cron, records)
    db.listen(SharedJobs.channel, jobs.on_notify)
    return jobs
