"""The PostgreSQL :class:`runtime.storage.dedupe.DedupeRecords` backend: table
``inbound_seen`` (``migrations/0012_inbound_dedupe.sql``). ``add`` is one
``INSERT … ON CONFLICT`` on the primary key: it wins for exactly one replica (an expired
row is taken over). Expired rows are deleted at load and at compaction.

The gateway's intake awaits ``aadd`` (the bridge's loop does the round trip; the event
loop goes on with other messages and turns); ``add`` is the blocking form (the start-up
resume). An outage must not stall intake: a failed or slow (``TIMEOUT``) statement is
logged, the key counts as new (the cluster work queue's own unique key still stops a
second run) and the store is not asked again for ``PAUSE`` seconds.
"""

from __future__ import annotations

import time

import structlog

from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import DB_ERRORS as _DB_ERRORS
from runtime.storage.postgres.pool import redact_dsn

log = structlog.get_logger(__name__)

PAUSE = 5.0  # seconds without asking after a failure
TIMEOUT = 2.0  # seconds one add may take
_ADD = """
INSERT INTO inbound_seen (key, seen_at) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET seen_at = EXCLUDED.seen_at
WHERE inbound_seen.seen_at <= $2 - $3
RETURNING true"""


class PgDedupeRecords:
    """Inbound message keys in PostgreSQL through a shared :class:`SyncBridge`."""

    def __init__(self, bridge: SyncBridge) -> None:
        self.bridge = bridge
        self.path = f"postgresql inbound_seen ({redact_dsn(bridge.dsn)})"
        self._paused_until = 0.0

    def load(self, now: float, ttl: float) -> dict[str, float]:
        try:
            self.bridge.call(lambda c: c.execute(
                "DELETE FROM inbound_seen WHERE seen_at <= $1", now - ttl), timeout=30.0)
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: unreachable ({type(exc).__name__}: {exc})") from None
        return {}  # the table answers "new?" itself; memory holds only this process's keys

    def add(self, key: str, now: float, ttl: float) -> bool:
        if time.monotonic() < self._paused_until:
            return True
        try:
            return bool(self.bridge.call(lambda c: c.fetchval(_ADD, key, now, ttl),
                                         timeout=TIMEOUT))
        except _DB_ERRORS as exc:
            return self._unreachable(exc)

    async def aadd(self, key: str, now: float, ttl: float) -> bool:
        """``add`` awaited from the gateway's loop (never blocking it)."""
        if time.monotonic() < self._paused_until:
            return True
        try:
            return bool(await self.bridge.acall(lambda c: c.fetchval(_ADD, key, now, ttl),
                                                timeout=TIMEOUT))
        except _DB_ERRORS as exc:
            return self._unreachable(exc)

    def _unreachable(self, exc: BaseException) -> bool:
        self._paused_until = time.monotonic() + PAUSE
        log.error("dedupe_store_unreachable", store=self.path, error=str(exc),
                  effect=f"keys count as new for {PAUSE:g}s")
        return True

    def compact(self, seen: dict[str, float], now: float, ttl: float) -> None:
        try:
            self.bridge.call(lambda c: c.execute(
                "DELETE FROM inbound_seen WHERE seen_at <= $1", now - ttl), timeout=30.0)
        except _DB_ERRORS as exc:
            log.warning("dedupe_compact_failed", store=self.path, error=str(exc))

    def close(self) -> None:
        """The bridge belongs to the gateway."""
