"""Cluster test helpers: a private PostgreSQL server per test module (tests/pg_server.py's
``PgServer``; private because the outage test stops it) and ``wait``."""

from __future__ import annotations

import time

import asyncpg
import pytest

from tests.pg_server import PgServer


def start_private_server() -> PgServer:
    server = PgServer()
    server.init()
    server.start()
    return server


def database_of(dsn: str) -> str:
    return dsn.rsplit("/", 1)[1]


@pytest.fixture(scope="module")
def pg():
    """One PostgreSQL server per test module (started, then destroyed)."""
    server = start_private_server()
    yield server
    server.destroy()


@pytest.fixture
def dsn(pg):
    """A fresh empty database on the module's server, for one test."""
    return pg.create_database()


def wait(pred, timeout: float = 30.0, what: str = "condition", every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


async def until(pred, what: str = "condition", timeout: float = 15.0,
                every: float = 0.02) -> None:
    """``wait`` for coroutines: poll ``pred()`` without blocking the event loop."""
    import asyncio
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(every)


@pytest.fixture
async def replica_dbs(pg_dsn):
    """Two replicas' :class:`ClusterDB` ("r1", "r2") on a migrated fresh database, both
    with a heartbeat row."""
    from gateway.cluster import membership
    from gateway.cluster.db import ClusterDB
    from runtime.storage.config import StorageSection
    from runtime.storage.postgres.pool import open_database
    pool = await open_database(StorageSection(backend="postgres", dsn=pg_dsn))
    await pool.close()
    out = {r: ClusterDB(pg_dsn) for r in ("r1", "r2")}
    for r, db in out.items():
        await db.ensure()
        await db.run(lambda c, r=r: membership.beat(c, r, None))
    yield out
    for db in out.values():
        await db.close()


async def pg_query(dsn: str, sql: str, *args) -> list[tuple]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


async def age(conn: asyncpg.Connection, replica: str) -> None:
    """The lease clock (database time) moves an hour on for ``replica``: its heartbeat
    and the leases it took are an hour older, so it is presumed dead (a SIGSTOP past the
    TTL, as the other replicas see it)."""
    await conn.execute("UPDATE cluster_replicas SET heartbeat_at = heartbeat_at - "
                       "interval '1 hour' WHERE id = $1", replica)
    await conn.execute("UPDATE cluster_leases SET acquired_at = acquired_at - "
                       "interval '1 hour' WHERE replica_id = $1", replica)


async def pause(db, replica: str) -> None:
    await db.run(lambda c: age(c, replica))
