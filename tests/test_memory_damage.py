"""Memory damage and repair: a gateway that found its index file damaged takes up the one
``memory reindex`` rebuilt on its next search; a stored vector of the wrong size (or not
finite) is skipped, counted by ``memory status`` and embedded again by ``memory reindex``
(``--force`` embeds everything again); an identity-linked person's DM transcript is
indexed in their canonical scope. The fake embeddings endpoint (tests/fakes/
fake_embeddings.py) counts what it was sent."""

from __future__ import annotations

import json
import sqlite3

import pytest
from structlog.testing import capture_logs

from tests.channel_harness import run_cli
from tests.fakes.fake_embeddings import FakeEmbeddings
from tests.test_memory_repairs import CONCEPTS, hub_of, search, setup

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def emb():
    fake = await FakeEmbeddings(CONCEPTS).start()
    yield fake
    await fake.stop()


async def test_a_gateway_takes_up_the_index_reindex_rebuilt_after_damage(tmp_path, emb):
    cfg, path, state = setup(tmp_path, emb)
    index = state / "memory" / "main" / "index.sqlite"
    index.parent.mkdir(parents=True)
    index.write_bytes(b"not a database at all " * 100)
    hub = hub_of(cfg, state)  # the running gateway's memory
    try:
        with capture_logs() as logs:
            assert (await search(hub, "tea"))["mode"] == "bm25"
            assert (await search(hub, "tea"))["mode"] == "bm25"  # not rebuilt yet
        assert [r["event"] for r in logs].count("memory_index_corrupt") == 1
        code, out, err = await run_cli(path, "memory", "reindex", "--json")
        assert code == 0 and json.loads(out)["embedded"] == 3, err
        with capture_logs() as logs:  # (the CLI, run in this process, reset the logging)
            found = await search(hub, "coffee")  # no shared word: the vectors answer
        assert found["mode"] == "hybrid" and "note" not in found
        assert found["results"][0]["text"] == "Alice drinks green tea."
        assert [r["event"] for r in logs].count("memory_index_reopened") == 1
    finally:
        await hub.close()


def _break_one_vector(index, blob: bytes) -> None:
    db = sqlite3.connect(index)
    db.execute("UPDATE vectors SET vector = ? WHERE rowid = (SELECT min(rowid) FROM vectors)",
               (blob,))
    db.commit()
    db.close()


@pytest.mark.parametrize("blob", [b"\x00\x00\x00\x00",  # one float: the wrong size
                                  b"\x00\x00\xc0\x7f" * 4,  # NaN, the right size
                                  b"\x01\x02\x03"])  # not even whole floats
async def test_one_unusable_stored_vector_is_skipped_reported_and_repaired(tmp_path, emb,
                                                                           blob):
    cfg, path, state = setup(tmp_path, emb)
    index = state / "memory" / "main" / "index.sqlite"
    hub = hub_of(cfg, state)  # a running gateway, synced
    try:
        assert (await search(hub, "tea"))["mode"] == "hybrid"
        _break_one_vector(index, blob)  # under it: its next search reads the vectors again
        with capture_logs() as logs:
            first = await search(hub, "deploy")
            second = await search(hub, "ship")
        assert first["mode"] == second["mode"] == "hybrid", first
        assert first["results"][0]["text"] == second["results"][0]["text"] == \
            "We deploy on Tuesdays."
        warned = [r for r in logs if r["event"] == "memory_index_bad_vectors"]
        assert len(warned) == 1 and warned[0]["count"] == 1
    finally:
        await hub.close()
    code, out, err = await run_cli(path, "memory", "status", "--json")
    assert code == 1 and json.loads(out)["bad_vectors"] == 1, (out, err)
    code, out, err = await run_cli(path, "memory", "status")
    assert "bad_vectors: 1" in out and "reindex" in out and "Traceback" not in err
    sent = len(emb.requests)
    code, out, err = await run_cli(path, "memory", "reindex", "--json")
    assert code == 0 and json.loads(out)["embedded"] == 1, err
    assert len(emb.requests) == sent + 1 and len(emb.requests[-1]) == 1
    code, out, err = await run_cli(path, "memory", "status", "--json")
    assert code == 0 and json.loads(out)["bad_vectors"] == 0


async def test_a_gateway_starting_on_an_unusable_vector_embeds_it_again(tmp_path, emb):
    cfg, path, state = setup(tmp_path, emb)
    code, out, err = await run_cli(path, "memory", "reindex", "--json")
    assert json.loads(out)["embedded"] == 3, err
    _break_one_vector(state / "memory" / "main" / "index.sqlite", b"\x00" * 4)
    hub = hub_of(cfg, state)
    try:
        found = await search(hub, "deploy")
        assert found["mode"] == "hybrid" and found["results"][0]["text"].startswith("We")
        assert len(emb.requests[-2]) == 1  # the one paragraph, then the query
    finally:
        await hub.close()
    code, out, err = await run_cli(path, "memory", "status", "--json")
    assert code == 0 and json.loads(out)["bad_vectors"] == 0, out


async def test_reindex_force_embeds_every_paragraph_again(tmp_path, emb):
    _cfg, path, _state = setup(tmp_path, emb)
    code, out, err = await run_cli(path, "memory", "reindex", "--json")
    assert json.loads(out)["embedded"] == 3, err
    code, out, err = await run_cli(path, "memory", "reindex", "--json")
    assert json.loads(out)["embedded"] == 0, err
    sent = len(emb.requests)
    code, out, err = await run_cli(path, "memory", "reindex", "--force", "--json")
    assert code == 0 and json.loads(out)["embedded"] == 3, err
    assert sorted(emb.requests[sent][i] for i in range(3)) == sorted(
        ["Alice drinks green tea.", "We deploy on Tuesdays.", "The office cat is Miso."])


async def test_a_nan_from_the_endpoint_is_an_outage_and_is_not_stored(tmp_path, emb):
    cfg, path, state = setup(tmp_path, emb)
    hub = hub_of(cfg, state)
    real = emb.vector
    emb.vector = lambda text: [float("nan")] * 4
    try:
        found = await search(hub, "tea")
        assert found["mode"] == "bm25" and "unavailable" in found["note"]
        assert "non-finite" in hub.search_for("main").last_error
    finally:
        emb.vector = real
        await hub.close()
    _code, out, err = await run_cli(path, "memory", "status", "--json")
    assert json.loads(out)["vectors"] == 0, (out, err)


async def test_a_linked_persons_dm_transcript_is_indexed_in_their_canonical_scope(tmp_path):
    from gateway.config.load import parse_config
    from gateway.memory.hub import MemoryHub
    from runtime.clock import SYSTEM_CLOCK
    from tests.helpers import base_config
    state = tmp_path / "state"
    cfg = base_config(state, memory={"index_transcripts": True},
                      session={"identity_links": {"ann": ["telegram:101", "slack:U024ANN"],
                                                  "kim": ["7"]}})
    hub = MemoryHub(parse_config(cfg, "t", env={}).config, state, SYSTEM_CLOCK)
    scope = hub.transcript_scope
    assert scope("agent:main:telegram:dm:ann") == "user:ann"
    assert scope("agent:main:telegram:default:dm:ann") == "user:ann"
    assert scope("agent:main:slack:dm:ann") == "user:ann"
    assert scope("agent:main:telegram:dm:101") == "user:ann"  # from before the link
    assert scope("agent:main:discord:dm:kim") == "user:kim"  # a bare id: any channel
    # ann has no discord id: a discord user whose id is "ann" is someone else
    assert scope("agent:main:discord:dm:ann") == "user:discord:ann"
    assert scope("agent:main:telegram:dm:102") == "user:telegram:102"


@pytest.fixture
def pg_bridge(pg_dsn):
    from runtime.storage.postgres.bridge import SyncBridge
    from tests.test_memory_postgres import migrated
    door = SyncBridge(migrated(pg_dsn))
    yield door
    door.close()


@pytest.mark.parametrize("bad", ["{1,2}", "{NaN,0,0}"])
def test_an_unusable_vector_in_postgres_is_skipped_counted_and_embedded_again(pg_bridge,
                                                                              bad):
    from runtime.storage.postgres.memory_index import PgVectorIndex
    from tests.storage_backends import pg_query
    idx = PgVectorIndex(pg_bridge, "main", "m")
    vecs = {"a": [1.0, 0.0, 0.0], "b": [0.8, 0.6, 0.0], "c": [0.0, 0.0, 1.0]}
    idx.sync(vecs, {("a", "agent"), ("b", "agent"), ("c", "agent")})
    pg_query(pg_bridge.dsn, f"UPDATE memory_vectors SET vector = '{bad}' WHERE hash = 'b'")
    idx.sync({}, {("a", "agent"), ("b", "agent"), ("c", "agent")})  # another process's rev
    fresh = PgVectorIndex(pg_bridge, "main", "m")  # as a restarted gateway or the CLI
    with capture_logs() as logs:
        for index in (idx, fresh):
            assert [h for h, _ in index.nearest([1.0, 0.1, 0.0], None, 3)] == ["a", "c"]
        assert fresh.stats()["bad_vectors"] == 1
        assert fresh.missing(["a", "b", "c"]) == ["b"]  # the next sync embeds it again
    assert len([r for r in logs if r["event"] == "memory_index_bad_vectors"]) == 2
    fresh.sync({"b": vecs["b"]}, {("a", "agent"), ("b", "agent"), ("c", "agent")})
    assert fresh.stats()["bad_vectors"] == 0 and fresh.missing(["a", "b", "c"]) == []
    assert [h for h, _ in idx.nearest([1.0, 0.1, 0.0], None, 3)] == ["a", "b", "c"]
