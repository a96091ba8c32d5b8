"""The semantic index: only changed paragraphs are re-embedded (``tidegate memory
reindex`` against a fake OpenAI-compatible /v1/embeddings, requests counted), ``status``,
the sqlite-vec and numpy backends agree, and the operator's ``memory`` commands."""

from __future__ import annotations

import json

import pytest

from runtime.memory.vectors import VectorIndex
from tests.channel_harness import run_cli, write_config
from tests.fakes.fake_embeddings import FakeEmbeddings
from tests.helpers import base_config

pytestmark = pytest.mark.timeout(60)

CONCEPTS = [{"tea", "coffee", "drink"}, {"deploy", "release", "ship"}, {"cat", "dog", "pet"},
            {"rain", "snow", "weather"}, {"book", "novel", "read"}]
NOTES = ["# Notes", "Alice drinks green tea.", "We deploy on Tuesdays.",
         "The office cat is named Miso.", "It will rain tomorrow.", "Read the new novel."]


def inputs(emb: FakeEmbeddings) -> list[str]:
    return [t for r in emb.requests for t in r]


async def test_reindex_embeds_only_changed_paragraphs_and_operator_commands(tmp_path):
    emb = await FakeEmbeddings(CONCEPTS).start()
    try:
        state = tmp_path / "state"
        ws = state / "workspace" / "main"
        ws.mkdir(parents=True)
        (ws / "MEMORY.md").write_text("\n\n".join(NOTES) + "\n")
        cfg = base_config(state, memory={"embeddings": {"provider": "emb", "model": "m1",
                                                        "batch_size": 2}})
        cfg["models"] = {"providers": {"emb": {"api": "openai", "base_url": emb.base_url}}}
        path = write_config(tmp_path, cfg)
        code, out, err = await run_cli(path, "memory", "reindex", "--json")
        assert code == 0, err
        first = json.loads(out)
        assert first["embedded"] == 5 and first["chunks"] == 5
        assert len(emb.requests) == 3  # batches of 2
        # edit one paragraph: exactly that one is embedded again
        (ws / "MEMORY.md").write_text("\n\n".join(NOTES).replace("Tuesdays", "Fridays") + "\n")
        emb.requests.clear()
        code, out, _ = await run_cli(path, "memory", "reindex", "--json")
        assert code == 0 and json.loads(out)["embedded"] == 1
        assert inputs(emb) == ["Notes\nWe deploy on Fridays."]
        emb.requests.clear()
        code, out, _ = await run_cli(path, "memory", "status", "--json")
        status = json.loads(out)
        assert code == 0 and emb.requests == [] and status["vectors"] == 5
        assert status["backend"].startswith("in-memory numpy")  # 5 chunks: held in memory

        # operators: list, search and forget a user's scope
        from gateway.config.load import parse_config
        from gateway.memory.hub import MemoryHub
        from runtime.clock import SYSTEM_CLOCK
        hub = MemoryHub(parse_config(cfg, "t", env={}).config, state, SYSTEM_CLOCK)
        hub.store_for("main").append("user:telegram:7", "Zoe keeps a pet dog", 1.0e9)
        code, out, _ = await run_cli(path, "memory", "list", "--user", "telegram:7", "--json")
        [entry] = json.loads(out)
        code, out, _ = await run_cli(path, "memory", "search", "--user", "telegram:7",
                                     "my cat", "--json")
        assert code == 0 and json.loads(out)[0]["text"] in ("Zoe keeps a pet dog",
                                                            "The office cat is named Miso.")
        code, _, err = await run_cli(path, "memory", "forget", "--user", "telegram:7")
        assert code == 2 and "--all" in err
        code, out, _ = await run_cli(path, "memory", "forget", "--user", "telegram:7",
                                     entry["id"], "--json")
        assert code == 0 and json.loads(out) == [{"id": entry["id"], "deleted": True}]
        assert not (state / "memory" / "main" / "scopes" / "user" / "telegram%3A7.md").exists()
        code, out, _ = await run_cli(path, "timeline", "show", "memory-main", "--json")
        assert "MEMORY_FORGET" in out and "Zoe" not in out
    finally:
        await emb.stop()


@pytest.mark.parametrize(("extension", "in_memory_max"),
                         [(True, 100), (True, 0), (False, 0)],
                         ids=["in-memory", "sqlite-vec-knn", "numpy-over-blobs"])
def test_vector_backends_rank_alike_and_filter_scopes(tmp_path, extension, in_memory_max):
    idx = VectorIndex(tmp_path / "i.sqlite", "m", use_extension=extension,
                      in_memory_max=in_memory_max)
    if extension and idx.vec_version is None:
        pytest.skip("this Python's sqlite3 cannot load sqlite-vec and pysqlite3 is missing")
    vecs = {"a": [1.0, 0.0, 0.0], "b": [0.8, 0.6, 0.0], "c": [0.0, 0.0, 1.0]}
    idx.sync(vecs, {("a", "agent"), ("b", "user:x"), ("c", "agent")})
    assert ("in-memory" in idx.backend) == (in_memory_max > 0)
    assert [h for h, _ in idx.nearest([1.0, 0.1, 0.0], None, 3)] == ["a", "b", "c"]
    assert [h for h, _ in idx.nearest([1.0, 0.1, 0.0], ["agent"], 3)] == ["a", "c"]
    [(h, sim)] = idx.nearest([0.0, 0.0, 2.0], ["agent", "user:y"], 1)
    assert h == "c" and sim == pytest.approx(1.0, abs=1e-5)
    idx.sync({}, {("a", "agent")})  # b and c gone: their vectors are deleted
    assert idx.stats()["vectors"] == 1 and idx.missing(["a", "b"]) == ["b"]
    assert [h for h, _ in idx.nearest([0.0, 0.0, 1.0], None, 3)] == ["a"]
    # a time window: only the allowed hashes are ranked
    idx.sync(vecs, {("a", "agent"), ("b", "agent"), ("c", "agent")})
    assert [h for h, _ in idx.nearest([1.0, 0.0, 0.0], None, 3, allowed={"b", "c"})] \
        == ["b", "c"]


def test_a_subagent_acts_for_the_sender_who_spawned_it_across_restarts(tmp_path):
    """The run record keeps whose memory the child uses (persisted), so a child spawned
    by a non-owner cannot write the agent scope, even after a restart."""
    import dataclasses

    from gateway.config.load import parse_config
    from gateway.memory.hub import MemoryHub
    from gateway.subagents import _asker_extra, _asker_of
    from runtime.clock import SYSTEM_CLOCK
    from runtime.memory.scopes import Asker
    from runtime.subagents.records import RunRecord, RunStore
    from runtime.tools.policy import ToolScope
    cfg = base_config(tmp_path / "state")
    cfg["agents"] = {"defaults": {"owners": ["telegram:1"]}}
    hub = MemoryHub(parse_config(cfg, "t", env={}).config, tmp_path / "state", SYSTEM_CLOCK)
    parent = ToolScope("main", asker=Asker("telegram:2", "telegram:-5"))
    rec = RunRecord("r1", "agent:main:subagent:x", "agent:main:telegram:group:-5", "s",
                    "main", "do it", 0.0, extra=_asker_extra(parent))
    store = RunStore(tmp_path / "runs.json")
    store.save({"r1": rec})
    [loaded] = store.load().values()
    child = hub.asker("main", ToolScope("main", subagent_depth=1, asker=_asker_of(loaded)))
    assert child.user == "telegram:2" and child.group == "telegram:-5"
    assert not child.writes_agent and child.visible() == ["agent", "group:telegram:-5",
                                                         "user:telegram:2"]
    owner = dataclasses.replace(parent, asker=Asker("telegram:1"))
    assert hub.asker("main", owner).writes_agent
    assert _asker_of(RunRecord("r2", "k", "k", "s", "main", "t", 0.0)) is None  # operator
