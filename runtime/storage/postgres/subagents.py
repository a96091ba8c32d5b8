"""Subagent run records in PostgreSQL (``migrations/0161_subagent_runs.sql``): the
backend of :class:`runtime.subagents.records.RunStore` on replicas.

Each replica writes the rows of the runs it started (``replica_id``) and, at start, loads
only those (the runs another replica started are that replica's to recover); every
replica and the CLI read every row, so ``subagents list|show`` answer for the whole
cluster. ``save`` returns at once: the changed records are upserted by the bridge's loop
(``write_behind``), retried through an outage, the newest version of each record wins.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import DB_ERRORS as _DB_ERRORS
from runtime.storage.postgres.pool import redact_dsn
from runtime.storage.postgres.write_behind import WriteBehind

READ_TIMEOUT = 5.0  # seconds: a read on the event loop gets an OSError, not a hang
_UPSERT = ("INSERT INTO subagent_runs (run_id, replica_id, requester_session_key, body) "
           "SELECT r.run_id, $1, r.body->>'requester_session_key', r.body FROM "
           "jsonb_to_recordset($2::jsonb) AS r(run_id text, body jsonb) "
           "ON CONFLICT (run_id) DO UPDATE SET body = EXCLUDED.body, updated_at = now()")


class PgRunRecords:
    """Run records (``RunRecord.to_json()`` dicts) of replica ``replica``."""

    def __init__(self, bridge: SyncBridge, replica: str) -> None:
        self.bridge, self.replica = bridge, replica
        self.path = f"postgresql subagent_runs ({redact_dsn(bridge.dsn)})"
        self._pending: dict[str, dict[str, Any]] = {}
        self._written: dict[str, str] = {}  # run id -> the JSON last queued
        self._spool = WriteBehind(bridge, self.path, take=self._take,
                                  restore=self._restore, write=self._upsert)

    def _read(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        try:
            rows = self.bridge.call(lambda c: c.fetch(sql, *args), timeout=READ_TIMEOUT)
        except _DB_ERRORS as exc:
            raise OSError(f"{self.path}: read failed ({type(exc).__name__}: {exc})") from None
        return [{**json.loads(r["body"]), "replica": r["replica_id"]} for r in rows]

    def load(self) -> list[dict[str, Any]]:
        """This replica's records (oldest first). Raises OSError."""
        return self._read("SELECT body, replica_id FROM subagent_runs WHERE replica_id = $1 "
                          "ORDER BY created_at, run_id", self.replica)

    def all(self) -> list[dict[str, Any]]:
        """Every replica's records, each with ``replica``. Raises OSError."""
        return self._read("SELECT body, replica_id FROM subagent_runs "
                          "ORDER BY created_at, run_id")

    def of(self, requester_key: str) -> list[dict[str, Any]]:
        """The records of one requester session, any replica's. Raises OSError."""
        return self._read("SELECT body, replica_id FROM subagent_runs WHERE "
                          "requester_session_key = $1 ORDER BY created_at, run_id",
                          requester_key)

    def get(self, run_id: str) -> dict[str, Any] | None:
        """One record, any replica's, or None. Raises OSError."""
        rows = self._read("SELECT body, replica_id FROM subagent_runs WHERE run_id = $1",
                          run_id)
        return rows[0] if rows else None

    def save(self, records: list[dict[str, Any]]) -> None:
        """Queue the records that changed since they were last queued; returns at once."""
        changed = []
        for rec in records:
            raw = json.dumps(rec, ensure_ascii=False, sort_keys=True)
            if self._written.get(rec["run_id"]) != raw:
                self._written[rec["run_id"]] = raw
                changed.append(rec)
        if changed:
            self._spool.submit(lambda: self._pending.update(
                {r["run_id"]: r for r in changed}))

    def wait_written(self, timeout: float = 30.0) -> None:
        """Block until the queued writes landed (tests, shutdown)."""
        self._spool.wait(timeout)

    def _take(self) -> dict[str, dict[str, Any]] | None:
        pending, self._pending = self._pending, {}
        return pending or None

    def _restore(self, pending: dict[str, dict[str, Any]]) -> None:
        self._pending = {**pending, **self._pending}  # newer versions win

    async def _upsert(self, conn: asyncpg.Connection,
                      pending: dict[str, dict[str, Any]]) -> None:
        rows = [{"run_id": k, "body": v} for k, v in pending.items()]
        await conn.execute(_UPSERT, self.replica, json.dumps(rows, ensure_ascii=False))
