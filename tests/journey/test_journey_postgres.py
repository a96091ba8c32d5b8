"""Stage: the installed wheel on a real PostgreSQL, as the replicas' docs have it.

``storage status`` shows every shipped migration pending, ``storage migrate`` applies them
all (the count is the number of ``.sql`` files the wheel installed), a second run applies
none, and two replicas sharing one config and the database start and answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.journey.driver import free_port, wait_for
from tests.pg_server import PgMissing, start_server


@pytest.fixture(scope="module")
def postgres():
    try:
        server = start_server()
    except PgMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.destroy()


def _shipped_migrations(install) -> list[str]:
    [site] = (install.root / "venv" / "lib").glob("python3*/site-packages")
    return sorted(p.stem for p in (site / "runtime/storage/postgres/migrations").glob("*.sql"))


def test_storage_migrate_then_two_replicas_answer(operator, model, postgres):
    shipped = _shipped_migrations(operator.install)
    assert len(shipped) >= 10, shipped
    shared = operator.home / "shared.yaml"
    shared.write_text(yaml.safe_dump({
        "gateway": {"port": "${TIDEGATE_PORT}"},
        "storage": {"backend": "postgres", "dsn": "${TIDEGATE_PG_DSN}"},
        "models": {"providers": {"fake": {"api": "openai", "base_url": model.base_url,
                                          "api_key": "${FAKE_KEY}"}}},
        "agents": {"defaults": {"model": "fake/fake-model"}}}))
    dsn = postgres.create_database()
    env = {"TIDEGATE_PG_DSN": dsn, "FAKE_KEY": "sk-fake-0123456789", "TIDEGATE_PORT": "1"}
    cfg = ("--config", str(shared))

    pending = operator.run(*cfg, "storage", "status", "--json", env=env)
    assert pending.returncode == 1  # not up to date
    before = json.loads(pending.stdout)
    assert [f"{m['version']:04d}_{m['name']}" for m in before["migrations"]] == shipped
    assert {m["state"] for m in before["migrations"]} == {"pending"}

    first = operator.ok(*cfg, "storage", "migrate", env=env)
    assert f"applied {len(shipped)} migration(s)" in first.stdout
    assert "schema up to date" in first.stdout
    again = operator.ok(*cfg, "storage", "migrate", env=env)
    assert "applied 0 migration(s)" in again.stdout and "schema up to date" in again.stdout

    replicas = {}
    for name in ("a", "b"):
        port = free_port()
        renv = {**env, "TIDEGATE_PORT": str(port), "TIDEGATE_REPLICA_ID": name,
                "TIDEGATE_STATE_DIR": str(operator.home / name)}
        replicas[name] = (operator.start_gateway(*cfg, env=renv, port=port), renv)
    for name, (_, renv) in replicas.items():
        out = operator.ok(*cfg, "agent", "-m", f"hello {name}", "--to", f"user-{name}",
                          env=renv)
        assert f"echo: hello {name}" in out.stdout
    def both_seen() -> bool:
        st = json.loads(operator.ok(*cfg, "status", "--json", env=replicas["a"][1]).stdout)
        return st["cluster"]["replica"] == "a" and {"a", "b"} <= set(st["cluster"]["replicas"])
    wait_for(both_seen, 30, "replica a listing both replicas in status")
    for fg, _ in replicas.values():
        assert fg.stop() == 0
    assert not list(Path(operator.home).glob("*/tidegate.env"))
