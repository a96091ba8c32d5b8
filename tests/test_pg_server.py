"""The test PostgreSQL server itself: real, reachable over TCP and the private socket, one
fresh database per test."""

from __future__ import annotations

import asyncpg


async def test_fresh_database_over_tcp_and_socket(pg_server, pg_dsn):
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname='public'") == 0
        await conn.execute("CREATE TABLE t (x int)")
        version = await conn.fetchval("SHOW server_version_num")
        assert int(version) >= 120000
    finally:
        await conn.close()
    name = pg_dsn.rsplit("/", 1)[1]
    conn = await asyncpg.connect(pg_server.socket_dsn(name))
    try:
        assert await conn.fetchval("SELECT count(*) FROM t") == 0
    finally:
        await conn.close()


async def test_each_test_gets_its_own_database(pg_dsn):
    conn = await asyncpg.connect(pg_dsn)
    try:
        # the previous test's table is not here
        assert await conn.fetchval("SELECT to_regclass('public.t')") is None
    finally:
        await conn.close()
