"""One ``usage_records`` row per model call on PostgreSQL, even when the insert's answer
was lost after it committed (PostgreSQL stopped, the connection cut): the ledger's
write-behind retries the batch, and the retry must not add the records a second time
(the restart test's "6 rows for 5 turns"). Real PostgreSQL; tests/pg_cut_proxy.py loses
the answer. Also: a database whose ``usage_records`` predates the record key gets it."""

from __future__ import annotations

import json

import asyncpg
import pytest

from runtime.storage.config import StorageSection
from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import open_database
from runtime.storage.postgres.usage import PgUsageRecords
from tests.cluster_harness import pg_query
from tests.pg_cut_proxy import CutProxy


@pytest.fixture
def cut(pg_server):
    p = CutProxy(lambda: pg_server.port).start()
    yield p
    p.close()


def _record(run_id: str) -> dict:
    return {"agent": "main", "session_key": "agent:main:t:dm:a", "channel": "t",
            "trigger": "user", "provider": "fake", "model": "m", "input": 10, "output": 2,
            "cache_read": 0, "cache_write": 0, "cost_usd": 0.0, "priced": False,
            "run_id": run_id}


async def test_a_usage_insert_whose_answer_was_lost_is_one_row_per_call(pg_dsn, cut):
    await (await open_database(StorageSection(backend="postgres", dsn=pg_dsn))).close()
    bridge = SyncBridge(cut.dsn(pg_dsn), timeout=5.0)
    store = PgUsageRecords(bridge)
    try:
        bridge.call(lambda c: c.fetchval("SELECT 1"))  # connected before the fault
        cut.arm(b"INSERT INTO usage_records")
        # two model rounds of one run (same run id, same usage): two calls, two rows
        store.append(_record("run1"), 1000.0)
        store.append(_record("run1"), 1000.0)
        store.close()  # waits for the write-behind: lost answer, retry, done
        assert cut.cuts == 1  # the first answer was lost after its commit: retried
        rows = await pg_query(pg_dsn, "SELECT record FROM usage_records ORDER BY id")
        assert len(rows) == 2, "the retried batch was inserted twice"
        assert [json.loads(r[0])["run_id"] for r in rows] == ["run1", "run1"]
        assert len(list(store.records())) == 2
        store.append(_record("run2"), 1001.0)  # later calls still land
        store.close()
        assert len(list(store.records())) == 3
    finally:
        bridge.close()


async def test_an_existing_usage_table_gains_the_record_key(pg_dsn, tmp_path):
    """A database migrated before the key: its rows stay, new ones are keyed."""
    from runtime.storage.postgres import migrate
    for m in migrate.available():
        if m.version < 200:  # the schema of the previous release
            (tmp_path / f"{m.version:04d}_{m.name}.sql").write_text(m.sql)
    conn = await asyncpg.connect(pg_dsn)
    try:
        await migrate.migrate(conn, tmp_path)
        await conn.execute("INSERT INTO usage_records (ts, record) VALUES (1, '{}')")
        await migrate.migrate(conn)
        cols = {r[0] for r in await conn.fetch(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'usage_records'")}
        assert "key" in cols
        assert await conn.fetchval("SELECT count(*) FROM usage_records") == 1
    finally:
        await conn.close()
