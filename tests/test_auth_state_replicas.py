"""Auth profile state shared by replicas on a real PostgreSQL (issue 15 "Shared state";
runtime/providers/failover/state.py, runtime/storage/postgres/documents.py ``update``):
two replicas that fail the same profile at the same moment both count, and the cooldown
only ever extends. Each replica writes a merge of its change into the stored document
under the row lock instead of its own whole view (last writer wins). Embedded storage
has one process per state dir, so two concurrent writers do not arise there."""

from __future__ import annotations

import asyncio
import json

import asyncpg

from runtime.clock import FakeClock
from runtime.providers.failover.state import AuthState
from tests.storage_backends import PostgresBackend

NAME = "auth-state.json"


async def _replica(backend: PostgresBackend, tmp_path) -> AuthState:
    """One replica's AuthState (its own bridge: its own connections)."""
    return AuthState(tmp_path / NAME, await backend.records("auth_state")).load()


async def _stored(dsn: str) -> dict:
    conn = await asyncpg.connect(dsn)
    try:
        return json.loads(await conn.fetchval(
            "SELECT body FROM state_documents WHERE name = $1", NAME))
    finally:
        await conn.close()


async def _waiters(probe: asyncpg.Connection) -> int:
    return await probe.fetchval("SELECT count(*) FROM pg_stat_activity WHERE "
                                "wait_event_type = 'Lock' AND query LIKE '%state_documents%'")


async def test_two_replicas_failing_one_profile_at_once_both_count(pg_dsn, tmp_path):
    backend = PostgresBackend(pg_dsn)
    clock = FakeClock()
    now = clock.time()
    try:
        first = await _replica(backend, tmp_path)
        first.failure("openai", "key1", "rate_limit", now, cooldown=60)
        await asyncio.to_thread(first.store.wait_written)
        r1, r2 = await _replica(backend, tmp_path), await _replica(backend, tmp_path)
        assert r1.profile("openai", "key1").failures == 1 == r2.profile("openai",
                                                                         "key1").failures
        probe = await asyncpg.connect(pg_dsn)
        try:
            hold = probe.transaction()  # both merges queue up behind this row lock
            await hold.start()
            await probe.execute("SELECT 1 FROM state_documents WHERE name = $1 FOR UPDATE",
                                NAME)
            r1.failure("openai", "key1", "rate_limit", now + 1, cooldown=600)
            r2.failure("openai", "key1", "server_error", now + 1, cooldown=30)
            watcher = await asyncpg.connect(pg_dsn)
            try:
                while await _waiters(watcher) < 2:
                    await asyncio.sleep(0.01)
            finally:
                await watcher.close()
            await hold.commit()
        finally:
            await probe.close()
        for r in (r1, r2):
            await asyncio.to_thread(r.store.wait_written)
        ps = (await _stored(pg_dsn))["providers"]["openai"]["profiles"]["key1"]
        assert ps["failures"] == 3
        assert ps["errors"] == {"rate_limit": 2, "server_error": 1}
        assert ps["cooldown_until"] == now + 1 + 600  # the longer bench stands
        # the replica whose merge went in last sees both; a restart reads them
        assert max(r.profile("openai", "key1").failures for r in (r1, r2)) == 3
        again = await _replica(backend, tmp_path)
        assert again.profile("openai", "key1").cooling(now + 2) == 599
        # a success recorded elsewhere before a later failure does not clear it
        again.success("openai", "key1", now + 0.5)
        await asyncio.to_thread(again.store.wait_written)
        ps = (await _stored(pg_dsn))["providers"]["openai"]["profiles"]["key1"]
        assert ps["failures"] == 3 and ps["cooldown_until"] == now + 601
        r1.success("openai", "key1", now + 700)  # a later success clears it
        await asyncio.to_thread(r1.store.wait_written)
        ps = (await _stored(pg_dsn))["providers"]["openai"]["profiles"]["key1"]
        assert ps["failures"] == 0 and ps["cooldown_until"] is None
        assert r1.last_good("openai") == "key1"
    finally:
        await backend.close()
