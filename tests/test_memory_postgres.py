"""The memory vector index on PostgreSQL storage (real PostgreSQL): the same behaviour as
the embedded index (content-hashed vectors, scopes, time windows, deletion), a second
process sees a sync made by another, ``tidegate memory reindex|status`` on a postgres
config embeds only changed paragraphs and says which ranking answers, and no index file
is written to the state dir. pgvector's ranking runs when the database can
``CREATE EXTENSION vector``."""

from __future__ import annotations

import asyncio
import json

import pytest

from runtime.storage.config import StorageSection
from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.memory_index import PgVectorIndex
from runtime.storage.postgres.pool import open_database
from tests.channel_harness import run_cli, write_config
from tests.fakes.fake_embeddings import FakeEmbeddings
from tests.helpers import base_config
from tests.storage_backends import pg_query
from tests.test_memory_index import CONCEPTS, NOTES, inputs

pytestmark = pytest.mark.timeout(60)


def migrated(dsn: str) -> str:
    async def run() -> None:
        pool = await open_database(StorageSection(backend="postgres", dsn=dsn))
        await pool.close()
    asyncio.run(run())
    return dsn


def _pgvector(dsn: str) -> bool:
    try:
        pg_query(dsn, "CREATE EXTENSION IF NOT EXISTS vector")
    except Exception:  # noqa: BLE001 - not installed on this server
        return False
    return True


@pytest.fixture(params=["column", "pgvector"])
def bridge(request, pg_dsn):
    dsn = migrated(pg_dsn)
    if request.param == "pgvector" and not _pgvector(dsn):
        pytest.skip("pgvector is not installed on this PostgreSQL (CREATE EXTENSION vector "
                    "failed): the real[] column ranking is what runs here")
    door = SyncBridge(dsn)
    yield door
    door.close()


def test_pg_index_ranks_filters_and_forgets(bridge):
    idx = PgVectorIndex(bridge, "main", "m")
    assert idx.backend.startswith("PostgreSQL with pgvector" if idx.pgvector else
                                  "PostgreSQL real[] column")
    vecs = {"a": [1.0, 0.0, 0.0], "b": [0.8, 0.6, 0.0], "c": [0.0, 0.0, 1.0]}
    assert idx.missing(["a", "b", "c", "a"]) == ["a", "b", "c"]
    assert idx.sync(vecs, {("a", "agent"), ("b", "user:x"), ("c", "agent")}) == 3
    assert [h for h, _ in idx.nearest([1.0, 0.1, 0.0], None, 3)] == ["a", "b", "c"]
    assert [h for h, _ in idx.nearest([1.0, 0.1, 0.0], ["agent"], 3)] == ["a", "c"]
    [(h, sim)] = idx.nearest([0.0, 0.0, 2.0], ["agent", "user:y"], 1)
    assert h == "c" and sim == pytest.approx(1.0, abs=1e-5)
    # another process (a replica, the CLI) sees the sync; a vector of another size fails
    other = PgVectorIndex(bridge, "main", "m")
    assert other.dims == 3 and other.missing(["a", "d"]) == ["d"]
    with pytest.raises(ValueError, match="dimensions"):
        other.sync({"d": [1.0, 0.0]}, {("d", "agent")})
    other.sync({}, {("a", "agent")})  # b and c gone: their vectors are deleted
    assert [h for h, _ in idx.nearest([0.0, 0.0, 1.0], None, 3)] == ["a"]  # reloaded
    assert idx.stats()["vectors"] == 1 and idx.missing(["a", "b"]) == ["b"]
    assert pg_query(bridge.dsn, "SELECT hash FROM memory_vectors") == [("a",)]
    idx.sync(vecs, {("a", "agent"), ("b", "agent"), ("c", "agent")})
    assert [h for h, _ in idx.nearest([1.0, 0.0, 0.0], None, 3, allowed={"b", "c"})] \
        == ["b", "c"]
    # agents are separate; a new model empties the agent's index
    assert PgVectorIndex(bridge, "ops", "m").nearest([1.0, 0.0, 0.0], None, 3) == []
    moved = PgVectorIndex(bridge, "main", "m2")
    assert moved.dims is None and moved.stats()["chunks"] == 0
    assert pg_query(bridge.dsn, "SELECT count(*) FROM memory_vectors") == [(0,)]


async def test_reindex_and_status_on_postgres_storage(tmp_path, pg_dsn):
    emb = await FakeEmbeddings(CONCEPTS).start()
    try:
        state = tmp_path / "state"
        ws = state / "workspace" / "main"
        ws.mkdir(parents=True)
        (ws / "MEMORY.md").write_text("\n\n".join(NOTES) + "\n")
        cfg = base_config(state, memory={"embeddings": {"provider": "emb", "model": "m1"}},
                          storage={"backend": "postgres", "dsn": pg_dsn})
        cfg["models"] = {"providers": {"emb": {"api": "openai", "base_url": emb.base_url}}}
        path = write_config(tmp_path, cfg)
        await asyncio.to_thread(migrated, pg_dsn)
        code, out, err = await run_cli(path, "memory", "reindex", "--json")
        assert code == 0, err
        assert json.loads(out)["embedded"] == 5 and json.loads(out)["chunks"] == 5
        (ws / "MEMORY.md").write_text("\n\n".join(NOTES).replace("Tuesdays", "Fridays") + "\n")
        emb.requests.clear()
        code, out, _ = await run_cli(path, "memory", "reindex", "--json")
        assert code == 0 and json.loads(out)["embedded"] == 1
        assert inputs(emb) == ["Notes\nWe deploy on Fridays."]
        emb.requests.clear()
        code, out, _ = await run_cli(path, "memory", "status", "--json")
        status = json.loads(out)
        assert code == 0 and emb.requests == [] and status["vectors"] == 5
        key = "main@" + (state / "memory" / "instance-id").read_text().strip()
        assert status["path"] == f"postgresql:memory_vectors/{key}"
        assert status["backend"].startswith("PostgreSQL real[] column, ranked by the gateway")
        assert not (state / "memory" / "main" / "index.sqlite").exists()
        rows = await asyncio.to_thread(pg_query, pg_dsn, "SELECT agent_id, model, dims "
                                       "FROM memory_index_meta")
        assert rows == [(key, "emb/m1@native", status["dimensions"])]
        # ranked by meaning through the database's vectors: no word of "coffee" is in
        # the tea note (BM25 alone finds nothing)
        code, out, _ = await run_cli(path, "memory", "search", "--user", "telegram:7",
                                     "coffee", "--json")
        assert code == 0 and json.loads(out)[0]["text"] == "Alice drinks green tea."
        # a second replica (its own state dir, its own memory files) keeps its own
        # chunks: the two reindexes do not delete each other's
        other = tmp_path / "replica-b"
        (other / "workspace" / "main").mkdir(parents=True)
        (other / "workspace" / "main" / "MEMORY.md").write_text("Bob keeps a cat.\n")
        (tmp_path / "b").mkdir()
        path_b = write_config(tmp_path / "b", {**cfg, "gateway": {**cfg["gateway"],
                                                                  "state_dir": str(other)}})
        code, out, err = await run_cli(path_b, "memory", "reindex", "--json")
        assert code == 0 and json.loads(out)["chunks"] == 1, err
        emb.requests.clear()
        code, out, _ = await run_cli(path, "memory", "reindex", "--json")
        assert code == 0 and json.loads(out)["embedded"] == 0 and json.loads(out)["chunks"] == 5
        assert emb.requests == []
    finally:
        await emb.stop()
