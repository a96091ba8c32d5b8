"""PostgreSQL schema migrations (issue 15 "Schema"): versioned files applied once under an
advisory lock, a changed applied file refused, ``tidegate storage migrate|status``, the
``storage`` config section, and the gateway migrating at start. Real PostgreSQL
(tests/pg_server.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
import yaml

from gateway.config.load import ConfigError, parse_config
from runtime.storage.postgres import migrate as mig
from runtime.storage.postgres.errors import MigrationError
from runtime.storage.postgres.pool import redact_dsn
from tests.helpers import ROOT, GatewayProcess, base_config


async def _ledger(dsn: str) -> list[tuple[int, str]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [(r["version"], r["name"]) for r in
                await conn.fetch("SELECT version, name FROM tidegate_migrations ORDER BY 1")]
    finally:
        await conn.close()


async def test_migrate_applies_every_file_once_then_nothing(pg_dsn):
    shipped = mig.available()
    assert shipped and [m.version for m in shipped] == sorted(m.version for m in shipped)
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert {s.state for s in await mig.status(conn)} == {"pending"}
        assert await conn.fetchval("SELECT to_regclass('tidegate_migrations')") is None
        first = await mig.migrate(conn)
        assert [m.version for m in first] == [m.version for m in shipped]
        assert await mig.migrate(conn) == []
        assert {s.state for s in await mig.status(conn)} == {"applied"}
        assert await conn.fetchval("SELECT to_regclass('sessions')") is not None
        # the lock is released: another session can take it at once
        assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", mig.MIGRATION_LOCK)
    finally:
        await conn.close()
    assert await _ledger(pg_dsn) == [(m.version, m.name) for m in shipped]


async def test_concurrent_migrations_apply_each_file_exactly_once(pg_dsn):
    conns = [await asyncpg.connect(pg_dsn) for _ in range(4)]
    try:
        results = await asyncio.gather(*(mig.migrate(c) for c in conns))
    finally:
        for c in conns:
            await c.close()
    applied = [m.version for r in results for m in r]
    assert sorted(applied) == [m.version for m in mig.available()]  # once in total
    assert sum(1 for r in results if r) == 1
    assert len(await _ledger(pg_dsn)) == len(mig.available())


async def test_changed_applied_file_is_refused_and_reported(pg_dsn):
    conn = await asyncpg.connect(pg_dsn)
    try:
        await mig.migrate(conn)
        await conn.execute("UPDATE tidegate_migrations SET checksum = 'x' WHERE version = 1")
        with pytest.raises(MigrationError, match="0001_.*changed after it was applied"):
            await mig.migrate(conn)
        states = {s.version: s.state for s in await mig.status(conn)}
        assert states[1] == "modified"
    finally:
        await conn.close()


async def test_failing_migration_leaves_nothing_half_applied(pg_dsn):
    conn = await asyncpg.connect(pg_dsn)
    try:
        await mig.migrate(conn)
        bad = mig.Migration(9999, "broken", "CREATE TABLE half (x int); SELECT 1/0;")
        with pytest.raises(MigrationError, match="9999_broken failed"):
            await mig._apply(conn, bad)
        assert await conn.fetchval("SELECT to_regclass('half')") is None
        assert 9999 not in {v for v, _ in await _ledger(pg_dsn)}
    finally:
        await conn.close()


def _cli(config_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "--config", str(config_path),
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_storage_cli_status_then_migrate(tmp_path, pg_dsn):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(base_config(tmp_path / "state", storage={
        "backend": "postgres", "dsn": pg_dsn, "pool": {"min": 1, "max": 2}})))
    before = _cli(cfg, "storage", "status", "--json")
    assert before.returncode == 1, before.stderr
    body = json.loads(before.stdout)
    assert not body["up_to_date"] and {m["state"] for m in body["migrations"]} == {"pending"}
    done = _cli(cfg, "storage", "migrate")
    assert done.returncode == 0, done.stderr
    assert "0001_sessions" in done.stdout and "schema up to date" in done.stdout
    after = json.loads(_cli(cfg, "storage", "status", "--json").stdout)
    assert after["up_to_date"] and {m["state"] for m in after["migrations"]} == {"applied"}
    again = _cli(cfg, "storage", "migrate", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["applied"] == []


def test_storage_cli_refusals(tmp_path, pg_server):
    embedded = tmp_path / "embedded.yaml"
    embedded.write_text(yaml.safe_dump(base_config(tmp_path / "s1")))
    r = _cli(embedded, "storage", "status")
    assert r.returncode == 2 and "storage.backend is embedded" in r.stderr
    # a server that is not there: exit 1, the password never printed
    dead = f"postgresql://tidegate:hunter2secret@127.0.0.1:{pg_server.port + 1}/x"
    down = tmp_path / "down.yaml"
    down.write_text(yaml.safe_dump(base_config(tmp_path / "s2", storage={
        "backend": "postgres", "dsn": dead, "pool": {"connect_timeout": "2s"}})))
    r = _cli(down, "storage", "migrate")
    assert r.returncode == 1 and "unavailable" in r.stderr
    assert "hunter2secret" not in r.stderr + r.stdout and "tidegate:***@" in r.stderr


def test_storage_cli_names_an_unset_dsn_variable(tmp_path):
    """README "Moving a single host onto PostgreSQL": the DSN lives in the service's env
    file, so a shell running `tidegate storage copy` may not have it. The error said
    'PostgreSQL at ${TIDEGATE_PG_DSN} is unavailable: invalid DSN: scheme is expected ...'."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(base_config(tmp_path / "state", storage={
        "backend": "postgres", "dsn": "${TIDEGATE_PG_DSN}"})))
    env = {k: v for k, v in os.environ.items() if k != "TIDEGATE_PG_DSN"}
    for args in (("storage", "status"), ("storage", "copy", "--from", "embedded", "--to",
                                         "postgres"), ("sessions", "list")):
        r = subprocess.run([sys.executable, "-m", "gateway.cli", "--config", str(cfg), *args],
                           cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 1, (args, r.stderr)
        assert "environment variable TIDEGATE_PG_DSN is not set" in r.stderr, (args, r.stderr)
        assert "scheme is expected" not in r.stderr


@pytest.mark.parametrize(("storage", "key"), [
    ({"backend": "postgres"}, "storage.dsn"),
    ({"backend": "postgres", "dsn": "x", "pool": {"min": 5, "max": 2}}, "storage.pool.min"),
    ({"backend": "mysql"}, "storage.backend"),
    ({"pol": {}}, "storage.pol"),
    ({"pool": {"max": 0}}, "storage.pool.max"),
])
def test_bad_storage_config_names_the_key(storage, key):
    with pytest.raises(ConfigError) as err:
        parse_config({"storage": storage}, "test", env={})
    assert key in str(err.value)


def test_storage_config_defaults_and_env_dsn():
    assert parse_config({}, "test", env={}).config.storage.backend == "embedded"
    loaded = parse_config({"storage": {"backend": "postgres", "dsn": "${TIDEGATE_PG_DSN}"}},
                          "test", env={"TIDEGATE_PG_DSN": "postgresql://u@h/db"})
    assert loaded.config.storage.dsn == "postgresql://u@h/db"
    assert loaded.config.storage.pool.min == 2 and loaded.config.storage.pool.max == 10


def test_redact_dsn_forms():
    assert redact_dsn("postgresql://u:pw@h:5/db") == "postgresql://u:***@h:5/db"
    assert redact_dsn("host=h password=pw user=u") == "host=h password=*** user=u"
    assert redact_dsn("postgres://u@h/db?password=pw&x=1") == "postgres://u@h/db?password=***&x=1"


def test_gateway_on_postgres_migrates_at_start(tmp_path, pg_dsn, pg_server):
    gw = GatewayProcess(tmp_path, base_config(tmp_path / "state", storage={
        "backend": "postgres", "dsn": pg_dsn}))
    gw.start()
    try:
        assert any(line.get("event") == "storage_ready" for line in gw.log_lines())
    finally:
        assert gw.stop() == 0
    assert len(asyncio.run(_ledger(pg_dsn))) == len(mig.available())
    # a database that does not exist: the gateway refuses to start, exit 1, a clear
    # message (an unreachable server is waited for: tests/test_cluster_replicas.py)
    (tmp_path / "d").mkdir()
    missing = pg_dsn.rsplit("/", 1)[0] + "/no_such_database"
    down = GatewayProcess(tmp_path / "d", base_config(tmp_path / "state2", storage={
        "backend": "postgres", "dsn": missing, "pool": {"connect_timeout": "2s"}}))
    with pytest.raises(RuntimeError, match="exited with 1.*unavailable.*no_such_database"):
        down.start()
    assert not any(x.get("event") == "storage_waiting_for_postgres"
                   for x in down.log_lines())


async def test_a_build_without_migration_files_fails_loudly(pg_dsn, tmp_path):
    """A wheel that left the .sql files out must not report its empty schema as up to
    date: migrate and status refuse, naming what is missing, and create nothing."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "README.txt").write_text("not a migration")
    with pytest.raises(MigrationError, match="no schema migration files.*incomplete"):
        mig.available(tmp_path)
    conn = await asyncpg.connect(pg_dsn)
    try:
        with pytest.raises(MigrationError, match="no schema migration files"):
            await mig.migrate(conn, tmp_path)
        with pytest.raises(MigrationError, match="no schema migration files"):
            await mig.status(conn, tmp_path)
        assert await conn.fetchval("SELECT to_regclass('tidegate_migrations')") is None
    finally:
        await conn.close()
