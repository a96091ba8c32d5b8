"""The PostgreSQL :class:`runtime.storage.cron.CronRecords` backend: tables ``cron_jobs``
and ``cron_runs`` (``migrations/0010_cron.sql``), shared by every replica.

A write upserts the changed jobs and tombstones the jobs this store knew that are gone
from the list (removed here), in one transaction, and NOTIFYs ``tidegate_cron`` with this
store's origin id so the other replicas re-read (``revision()`` is the polling fallback).
A job row is only replaced by a definition at least as new (``updated_at``): a replica
that has not yet seen another's edit or removal cannot write its stale copy back.

The gateway awaits ``awrite``/``aread_runs`` (the bridge's loop does the round trips, the
gateway's loop goes on); run records are queued and inserted in order in the background
(``write_behind``), so finishing a run never waits for PostgreSQL. The blocking ``write``
and ``read_runs`` serve the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable, Collection, Iterator
from typing import Any

import asyncpg
import structlog

from runtime.storage.cron import CronStoreError
from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import DB_ERRORS as _DB_ERRORS
from runtime.storage.postgres.pool import redact_dsn
from runtime.storage.postgres.write_behind import WriteBehind

log = structlog.get_logger(__name__)

NOTIFY_CHANNEL = "tidegate_cron"
_UPSERT = """
INSERT INTO cron_jobs (job_id, job, defined_at) VALUES ($1, $2, $3)
ON CONFLICT (job_id) DO UPDATE SET job = EXCLUDED.job, defined_at = EXCLUDED.defined_at,
    removed = false, rev = nextval('cron_jobs_rev'), saved_at = now()
WHERE cron_jobs.defined_at <= EXCLUDED.defined_at
  AND (NOT cron_jobs.removed OR cron_jobs.defined_at < EXCLUDED.defined_at)"""


class PgCronRecords:
    """Cron jobs and run logs in PostgreSQL through a shared :class:`SyncBridge`."""

    def __init__(self, bridge: SyncBridge) -> None:
        self.bridge = bridge
        self.path = f"postgresql cron_jobs ({redact_dsn(bridge.dsn)})"
        self.origin = uuid.uuid4().hex  # NOTIFY payload: who wrote
        self._known: set[str] = set()  # ids read or written by this store
        self._queued: list[tuple[str, str]] = []  # run records not yet inserted
        self._runs = WriteBehind(bridge, f"{self.path} cron_runs", take=self._take_runs,
                                 restore=self._restore_runs,
                                 write=lambda c, batch: c.executemany(
                                     "INSERT INTO cron_runs (job_id, record) VALUES "
                                     "($1, $2)", batch))

    def _call(self, fn: Any, what: str) -> Any:
        try:
            return self.bridge.call(fn)
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: {what} failed ({type(exc).__name__}: {exc})") from None

    @contextlib.contextmanager
    def lock(self, exclusive: bool) -> Iterator[None]:
        yield  # rows are written atomically; concurrent writers merge (module docstring)

    def read(self) -> tuple[list[Any], float | None]:
        async def fetch(conn: asyncpg.Connection) -> list[Any]:
            return await conn.fetch("SELECT job_id, job FROM cron_jobs WHERE NOT removed "
                                    "ORDER BY position")
        try:
            rows = self._call(fetch, "read")
        except OSError as exc:
            raise CronStoreError(str(exc)) from None
        out = []
        for job_id, text in rows:
            try:
                out.append(json.loads(text))
            except ValueError as exc:
                raise CronStoreError(f"{self.path}: job {job_id!r} is not valid JSON "
                                     f"({exc})") from None
        self._known = {r[0] for r in rows}
        return out, None

    def _writer(self, lines: dict[str, str], changed: Collection[str] | None,
                defined_at: dict[str, float]) -> Callable[[asyncpg.Connection], Any]:
        ids = list(lines) if changed is None else [i for i in lines if i in changed]
        removed = sorted(self._known - set(lines))

        async def run(conn: asyncpg.Connection) -> None:
            async with conn.transaction():
                if ids:
                    await conn.executemany(_UPSERT, [(i, lines[i], defined_at.get(i, 0.0))
                                                     for i in ids])
                if removed:
                    await conn.execute(
                        "UPDATE cron_jobs SET removed = true, rev = nextval('cron_jobs_rev'),"
                        " saved_at = now() WHERE job_id = ANY($1::text[]) AND NOT removed",
                        removed)
                if ids or removed:
                    await conn.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL,
                                       self.origin)
        return run

    def write(self, lines: dict[str, str], changed: Collection[str] | None,
              defined_at: dict[str, float]) -> None:
        self._call(self._writer(lines, changed, defined_at), "write")
        self._known = set(lines)

    async def awrite(self, lines: dict[str, str], changed: Collection[str] | None,
                     defined_at: dict[str, float]) -> None:
        """``write`` awaited from the gateway's loop (never blocking it). Raises OSError."""
        try:
            await self.bridge.acall(self._writer(lines, changed, defined_at))
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: write failed ({type(exc).__name__}: {exc})") from None
        self._known = set(lines)

    def revision(self) -> int:
        """The newest write's number (0 when none); changes whenever any replica writes.
        Raises OSError."""
        return int(self._call(lambda c: c.fetchval(
            "SELECT coalesce(max(rev), 0) FROM cron_jobs"), "revision"))

    def append_run(self, job_id: str, record: dict[str, Any]) -> None:
        """Queue one run record; returns at once (``write_behind``: inserted in order on
        the bridge's loop, retried while PostgreSQL is unreachable)."""
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        self._runs.submit(lambda: self._queued.append((job_id, text)))

    def _take_runs(self) -> list[tuple[str, str]] | None:
        batch, self._queued = self._queued, []
        return batch or None

    def _restore_runs(self, batch: list[tuple[str, str]]) -> None:
        self._queued[:0] = batch

    def _fetch_runs(self, job_id: str, limit: int) -> Callable[[asyncpg.Connection], Any]:
        return lambda c: c.fetch(
            "SELECT record FROM (SELECT id, record FROM cron_runs WHERE job_id = $1 "
            "ORDER BY id DESC LIMIT $2) r ORDER BY id", job_id, limit)

    def read_runs(self, job_id: str, limit: int = 50) -> list[dict[str, Any]]:
        if limit <= 0:
            return []
        self._runs.wait(30.0)  # what this process queued first
        return _records(self._call(self._fetch_runs(job_id, limit), "run log read"))

    async def settled(self, timeout: float = 10.0) -> None:
        """Wait (up to ``timeout`` s: an outage keeps them queued) until the run records
        queued so far are inserted (the service's stop)."""
        if self._runs.writer is not None:
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(
                    self._runs.writer)), timeout)
            except TimeoutError:
                log.error("cron_run_log_unsaved", pending=len(self._queued),
                          store=self.path)

    async def aread_runs(self, job_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """``read_runs`` awaited from the gateway's loop. Raises OSError."""
        if limit <= 0:
            return []
        await self.settled()
        try:
            rows = await self.bridge.acall(self._fetch_runs(job_id, limit))
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: run log read failed ({type(exc).__name__}: "
                          f"{exc})") from None
        return _records(rows)


def _records(rows: list[Any]) -> list[dict[str, Any]]:
    return [rec for (text,) in rows if isinstance(rec := json.loads(text), dict)]
