"""One current session id per session key across replicas (gateway/sessions/identity.py):
two session stores of one agent on the same real PostgreSQL — two replicas that each
hold the session in memory, or not — never both make a session id current for a key;
the one that loses the compare-and-set takes the other's session, and reads answer from
the shared table."""

from __future__ import annotations

import asyncio

from gateway.sessions import identity
from gateway.sessions.identity import SessionExists
from gateway.sessions.store import SessionStore
from runtime.clock import FakeClock
from runtime.storage.postgres.sessions import PgSessionRecords
from tests.cluster_harness import pg_query
from tests.storage_backends import PostgresBackend

KEY = "agent:main:openai:dm:ua"


async def _stores(backend: PostgresBackend, tmp_path) -> list[SessionStore]:
    bridge = await backend.bridge()
    return [SessionStore(tmp_path / f"r{i}.db", "main", clock=FakeClock(),
                         records=PgSessionRecords(bridge, "main")).load() for i in range(2)]


async def test_two_replicas_creating_one_key_at_once_end_with_one_session_id(pg_dsn,
                                                                             tmp_path):
    backend = PostgresBackend(pg_dsn)
    try:
        a, b = await _stores(backend, tmp_path)
        got = await asyncio.gather(a.create(KEY), b.create(KEY), return_exceptions=True)
        won = [g for g in got if not isinstance(g, Exception)]
        lost = [g for g in got if isinstance(g, SessionExists)]
        assert len(won) == 1 and len(lost) == 1
        assert lost[0].entry.session_id == won[0].session_id
        assert a.get(KEY).session_id == b.get(KEY).session_id == won[0].session_id
        assert await pg_query(pg_dsn, "SELECT session_id FROM sessions") == [
            (won[0].session_id,)]
        # a reset replaces only the id it knew: b's stale view cannot fork the key
        newer = await a.create(KEY)
        try:
            await b.create(KEY)
            raise AssertionError("a create over a stale id must not succeed")
        except SessionExists as exc:
            assert exc.entry.session_id == newer.session_id
        assert await pg_query(pg_dsn, "SELECT session_id FROM sessions") == [
            (newer.session_id,)]
    finally:
        await backend.close()


async def test_reads_answer_from_the_shared_table(pg_dsn, tmp_path):
    """A session created through one store is found, listed and read through the other,
    which never held it in memory."""
    backend = PostgresBackend(pg_dsn)
    try:
        a, b = await _stores(backend, tmp_path)
        entry = await a.create(KEY)
        assert b.get(KEY) is None  # not in b's memory ...
        assert (await identity.lookup(b, KEY)).session_id == entry.session_id  # ... shared
        assert [e.session_id for e in await identity.entries(b)] == [entry.session_id]
        agents = {"main": type("Agent", (), {"store": b})()}
        found = await identity.find(agents, KEY)
        assert found is not None and found[1].session_id == entry.session_id
        assert await identity.find(agents, "agent:main:openai:dm:nobody") is None
    finally:
        await backend.close()
