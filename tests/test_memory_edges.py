"""Memory edges: the operator commands say what happened in one plain line (a query
with no searchable words, an id that is not there, nothing found) and refuse ``forget
--all ID``; ``status`` reads as text, without the logs' JSON; an empty ``memory_write``
is refused; a refused write leaves nothing behind and is logged with what the model
asked for."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from structlog.testing import capture_logs

from tests.channel_harness import run_cli, write_config
from tests.fakes.fake_embeddings import FakeEmbeddings
from tests.helpers import base_config
from tests.test_memory_repairs import CONCEPTS, hub_of, setup

pytestmark = pytest.mark.timeout(60)


def scoped(tmp_path, entries: dict[str, list[str]]):
    """(config path, state dir) with ``entries`` (scope -> texts) saved."""
    from zoneinfo import ZoneInfo

    from runtime.memory.scopes import ScopeStore
    state = tmp_path / "state"
    (state / "workspace" / "main").mkdir(parents=True)
    store = ScopeStore(state / "memory" / "main" / "scopes", ZoneInfo("UTC"))
    for scope, texts in entries.items():
        for i, text in enumerate(texts):
            store.append(scope, text, 1_700_000_000.0 + i)
    ids = {s: [e.entry_id for e in store.entries(s)] for s in entries}
    return write_config(tmp_path, base_config(state)), state, ids


async def test_cli_search_without_searchable_words_is_one_error_line(tmp_path):
    path, _, _ = scoped(tmp_path, {"user:telegram:1": ["Ann likes tea."]})
    for query in ("", "   ", "the a of"):
        code, _out, err = await run_cli(path, "memory", "search", "--user", "telegram:1", query)
        assert code == 2 and "Traceback" not in err, err
        assert err.startswith("error: ") and "no searchable words" in err
    code, _out, err = await run_cli(path, "memory", "search", "--user", "telegram:1", "bikes")
    assert code == 1 and "nothing found for 'bikes'" in err and "no entries" not in err


async def test_cli_forget_names_a_missing_id_and_refuses_all_with_ids(tmp_path):
    path, _state, ids = scoped(tmp_path, {"user:telegram:2": ["Bob rides.", "Bob has a cat."]})
    code, out, err = await run_cli(path, "memory", "forget", "--user", "telegram:2",
                                   "deadbeef00")
    assert code == 1 and "no entry deadbeef00 in user:telegram:2" in err
    keep, drop = ids["user:telegram:2"]
    code, out, err = await run_cli(path, "memory", "forget", "--user", "telegram:2",
                                   "--all", drop)
    assert code == 2 and "not both" in err
    code, out, err = await run_cli(path, "memory", "list", "--user", "telegram:2", "--json")
    assert [r["id"] for r in json.loads(out)] == [keep, drop]  # nothing was deleted
    code, out, err = await run_cli(path, "memory", "forget", "--user", "telegram:2", drop,
                                   "deadbeef00")
    assert code == 0 and f"[{drop}] deleted" in out and "not found: deadbeef00" in err
    code, out, err = await run_cli(path, "memory", "list", "--user", "telegram:2", "--json")
    assert [r["id"] for r in json.loads(out)] == [keep]


async def test_cli_status_is_plain_text_and_prints_no_log_json(tmp_path):
    emb = await FakeEmbeddings(CONCEPTS).start()
    try:
        _cfg, path, state = setup(tmp_path, emb)
        code, out, err = await run_cli(path, "memory", "status")
        assert code == 0 and "semantic: yes" in out and "dimensions: native" in out, out
        assert "True" not in out and "None" not in out
        index = state / "memory" / "main" / "index.sqlite"
        index.write_bytes(b"not a database at all " * 100)
        code, out, err = await run_cli(path, "memory", "status")
        assert code == 1 and "index: corrupt" in out and "semantic: no" in out
        assert "{" not in err, err  # the memory_index_corrupt log line is not printed
        emb.fail(500, 10)
        index.unlink()
        code, out, err = await run_cli(path, "memory", "search", "--user", "telegram:1",
                                       "tea")
        assert code == 0 and err.startswith("note: ") and "{" not in err, err
    finally:
        await emb.stop()


def _ctx(tmp_path, user: str):
    from gateway.config.load import parse_config
    from gateway.memory.hub import MemoryHub
    from runtime.clock import SYSTEM_CLOCK
    from runtime.memory.scopes import Asker
    from runtime.tools.registry import ToolContext
    state = tmp_path / "state"
    ws = state / "workspace" / "main"
    ws.mkdir(parents=True)
    cfg = base_config(state)
    cfg["agents"] = {"defaults": {"owners": ["telegram:100"]}}
    hub = MemoryHub(parse_config(cfg, "t", env={}).config, state, SYSTEM_CLOCK)
    ctx = ToolContext(workspace=ws, session_key="agent:main:telegram:dm:104", agent_id="main")
    ctx.extra["memory"] = hub
    ctx.scope = SimpleNamespace(asker=Asker(user, None, False))
    return ctx, hub


async def test_an_empty_memory_write_is_refused(tmp_path):
    from runtime.tools.registry import ToolError
    from runtime.tools.sources import MEMORY_WRITE_TOOL
    ctx, hub = _ctx(tmp_path, "telegram:104")
    for text in ("   ", "\n\t\n"):
        with pytest.raises(ToolError, match="empty"):
            await MEMORY_WRITE_TOOL.handler({"text": text}, ctx)
    assert hub.store_for("main").entries("user:telegram:104") == []
    ctx.scope = None  # the operator: the agent scope
    with pytest.raises(ToolError, match="empty"):
        await MEMORY_WRITE_TOOL.handler({"text": " ", "target": "long_term"}, ctx)
    assert not (ctx.workspace / "MEMORY.md").exists()


async def test_a_refused_write_leaves_no_directory_and_logs_what_was_asked(tmp_path):
    from runtime.tools.fs import write_tool
    from runtime.tools.registry import ToolError
    from runtime.tools.sources import MEMORY_WRITE_TOOL
    ctx, _ = _ctx(tmp_path, "telegram:104")
    for rel in ("Memory/x.md", "memory/deep/er/x.md", "a/../memory/x.md"):
        with pytest.raises(ToolError, match="only the agent's owners"):
            await write_tool({"path": rel, "content": "hi"}, ctx)
    assert sorted(p.name for p in ctx.workspace.iterdir()) == []
    await write_tool({"path": "notes/today.md", "content": "hi"}, ctx)  # still allowed
    assert (ctx.workspace / "notes" / "today.md").read_text() == "hi"
    with capture_logs() as logs:
        with pytest.raises(ToolError, match="only the agent's owners"):
            await MEMORY_WRITE_TOOL.handler({"text": "x", "scope": "agent"}, ctx)
        with pytest.raises(ToolError, match="MEMORY.md"):
            await MEMORY_WRITE_TOOL.handler({"text": "x", "target": "long_term"}, ctx)
    first, second = [r for r in logs if r["event"] == "memory_write_refused"]
    assert first["target"] is None and first["scope"] == "agent"
    assert second["target"] == "long_term" and second["scope"] is None
    # a non-owner's daily note (the default target) is theirs
    assert "saved for this person" in await MEMORY_WRITE_TOOL.handler(
        {"text": "x", "target": "daily"}, ctx)


@pytest.mark.parametrize("floor, found", [(None, 0), (-1.0, 3)])
async def test_paragraphs_unrelated_to_the_query_stay_out_of_the_vector_list(tmp_path,
                                                                            floor, found):
    from tests.test_memory_repairs import search
    emb = await FakeEmbeddings(CONCEPTS).start()
    try:
        cfg, _, state = setup(tmp_path, emb)
        if floor is not None:
            cfg["memory"]["embeddings"]["min_similarity"] = floor
        hub = hub_of(cfg, state)
        try:
            # no note shares a word or a concept with it (cosine about 0.05)
            res = await search(hub, "bicycle repairs")
            assert res["mode"] == "hybrid"
            assert len(res["results"]) == found
            near = await search(hub, "coffee")  # a paraphrase still passes the floor
            assert near["results"][0]["text"] == "Alice drinks green tea."
            assert len(near["results"]) == (1 if floor is None else 3)
        finally:
            await hub.close()
    finally:
        await emb.stop()
