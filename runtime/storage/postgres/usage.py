"""The PostgreSQL :class:`runtime.storage.usage.UsageRecords` backend: table
``usage_records`` (``migrations/0014_usage.sql``), each row the JSON line the embedded
ledger would write. ``append`` returns at once (``write_behind``): records queue in memory
and the bridge's loop inserts them in batches, retrying while PostgreSQL is unreachable,
so a model call never waits for the ledger and an outage loses nothing the process
outlives. Each record carries a random ``key`` (``migrations/0200_usage_record_key.sql``)
made when it is queued: a batch retried after its commit's answer was lost inserts
nothing twice (``ON CONFLICT DO NOTHING``), so there is one row per model call.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import structlog

from runtime.clock import utc_iso
from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import DB_ERRORS as _DB_ERRORS
from runtime.storage.postgres.pool import redact_dsn
from runtime.storage.postgres.write_behind import WriteBehind

log = structlog.get_logger(__name__)

READ_TIMEOUT = 5.0  # seconds: status and /usage answer (with an error) rather than hang
# a retried batch whose first commit went through (its answer lost) adds nothing twice
_INSERT = ("INSERT INTO usage_records (ts, record, key) VALUES ($1, $2, $3) "
           "ON CONFLICT (key) DO NOTHING")


class PgUsageRecords:
    """The usage ledger in PostgreSQL through a shared :class:`SyncBridge`."""

    def __init__(self, bridge: SyncBridge) -> None:
        self.bridge = bridge
        self.path = f"postgresql usage_records ({redact_dsn(bridge.dsn)})"
        self._queue: list[tuple[float, str, str]] = []  # (ts, record line, key)
        self._spool = WriteBehind(bridge, self.path, take=self._take, restore=self._restore,
                                  write=lambda c, batch: c.executemany(_INSERT, batch))

    def _take(self) -> list[tuple[float, str, str]] | None:
        batch, self._queue = self._queue, []
        return batch or None

    def _restore(self, batch: list[tuple[float, str, str]]) -> None:
        self._queue[:0] = batch  # in front of anything newer

    def append(self, record: dict[str, Any], now: float) -> None:
        line = json.dumps({"ts": utc_iso(now), **record}, ensure_ascii=False,
                          separators=(",", ":"))
        key = uuid.uuid4().hex  # made once: every retry of this record inserts it once
        self._spool.submit(lambda: self._queue.append((float(now), line, key)))

    def _fetch(self, since: float | None, until: float | None) -> Any:
        return lambda c: c.fetch(
            "SELECT ts, record FROM usage_records WHERE ts >= $1 AND ts < $2 "
            "ORDER BY ts, id", since if since is not None else float("-inf"),
            until if until is not None else float("inf"))

    def records(self, since: float | None = None,
                until: float | None = None) -> Iterator[dict[str, Any]]:
        """Blocking (the CLI, the start): the records in [since, until). Raises OSError."""
        try:
            rows = self.bridge.call(self._fetch(since, until), timeout=READ_TIMEOUT)
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: read failed ({type(exc).__name__}: {exc})") from None
        return self._parse(rows)

    async def arecords(self, since: float | None = None,
                       until: float | None = None) -> list[dict[str, Any]]:
        """``records`` for the gateway's loop: awaited, never blocking it."""
        try:
            rows = await self.bridge.acall(self._fetch(since, until), timeout=READ_TIMEOUT)
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: read failed ({type(exc).__name__}: {exc})") from None
        return list(self._parse(rows))

    @staticmethod
    def _parse(rows: list[Any]) -> Iterator[dict[str, Any]]:
        for ts, text in rows:
            try:
                rec = json.loads(text)
            except ValueError:
                continue
            if isinstance(rec, dict):
                rec["_t"] = ts
                yield rec

    def close(self) -> None:
        """Wait (up to 10 s) for queued records to land."""
        try:
            self._spool.wait(10.0)
        except Exception as exc:  # noqa: BLE001 - closing: report, do not raise
            log.error("usage_ledger_flush_failed", pending=len(self._queue),
                      error=str(exc))
