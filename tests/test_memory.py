"""memory_search: paragraphs, created_at, time windows, decay, caching, the tool wrapper."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from runtime.clock import FakeClock, parse_iso
from runtime.memory import MemoryIndex, run_memory_search_tool, tokenize
from runtime.tools.sources import MEMORY_TOOL as MEMORY_SEARCH_TOOL

DAY1 = parse_iso("2026-01-01T00:00:00+08:00")  # daily notes are dated in Asia/Shanghai
DAY2 = parse_iso("2026-01-02T00:00:00+08:00")
DAY3 = parse_iso("2026-01-03T00:00:00+08:00")
NOW = parse_iso("2026-01-03T12:00:00+08:00")
TZ = "Asia/Shanghai"


def _write(path: Path, text: str, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if mtime is not None:
        os.utime(path, (mtime, mtime))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    _write(tmp_path / "MEMORY.md", "# People\n\n## Alice\nAlice prefers tea over coffee.\n\n"
           "Alice's birthday is in March.\n", mtime=DAY1 - 86400)
    _write(tmp_path / "memory" / "2026-01-01.md",
           "# Deploy\nDeployed the gateway to the staging server.\n\n"
           "Fixed a bug in the heartbeat runner.\n")
    _write(tmp_path / "memory" / "2026-01-02.md",
           "# Deploy\nThe gateway deploy to production failed: disk full.\n\n"
           "[2026-01-02 15:30] Cleaned the disk and redeployed the gateway.\n\n"
           "<!-- ts: 2026-01-02T21:00:00+08:00 -->\n时间轴模块已经上线。\n")
    _write(tmp_path / "memory" / "2026-01-03.md", "- [09:15] Coffee with Bob about the gateway.\n")
    _write(tmp_path / "notes.md", "gateway gateway gateway (not a memory file)\n")
    return tmp_path


def test_paragraphs_headings_lines_and_created_at(ws):
    idx = MemoryIndex(ws, tz=TZ)
    hits = idx.search("tea", now=NOW)
    assert [(h.path, h.line, h.heading, h.text) for h in hits] == [
        ("MEMORY.md", 4, "People > Alice", "Alice prefers tea over coffee.")]
    assert hits[0].created_at == DAY1 - 86400  # MEMORY.md: file mtime

    by_text = {h.text: h for h in idx.search("gateway deploy disk", now=NOW, limit=10)}
    assert by_text["Deployed the gateway to the staging server."].created_at == DAY1
    assert by_text["Deployed the gateway to the staging server."].heading == "Deploy"
    assert by_text["Deployed the gateway to the staging server."].line == 2
    # leading [YYYY-MM-DD HH:MM] stamp, local time
    assert by_text["[2026-01-02 15:30] Cleaned the disk and redeployed the gateway."].created_at \
        == DAY2 + 15.5 * 3600
    # [HH:MM] in a daily note uses the note's date
    coffee = idx.search("Bob", now=NOW)[0]
    assert coffee.created_at == DAY3 + 9.25 * 3600 and coffee.path == "memory/2026-01-03.md"
    # <!-- ts: --> comment: used and hidden; Chinese matched via character bigrams
    zh = idx.search("时间轴", now=NOW)
    assert [h.text for h in zh] == ["时间轴模块已经上线。"]
    assert zh[0].created_at == DAY2 + 21 * 3600
    # files outside MEMORY.md / memory/ are not indexed
    assert all(h.path != "notes.md" for h in idx.search("gateway", now=NOW, limit=20))


def test_only_matching_paragraphs_ranked_by_bm25(ws):
    idx = MemoryIndex(ws, tz=TZ)
    assert idx.search("zebra", now=NOW) == []
    hits = idx.search("gateway", now=NOW, limit=10)
    assert len(hits) == 4 and all("gateway" in h.text.lower() for h in hits)
    assert all(h.score == h.relevance > 0 for h in hits)  # λ = 0: no decay
    assert hits == sorted(hits, key=lambda h: -h.score)
    assert len(idx.search("gateway", now=NOW, limit=2)) == 2


def test_time_window_filters(ws):
    idx = MemoryIndex(ws, tz=TZ)
    day2 = idx.search("gateway", now=NOW, limit=10, created_after=DAY2, created_before=DAY3)
    assert {h.path for h in day2} == {"memory/2026-01-02.md"}
    assert len(day2) == 2
    before = idx.search("gateway", now=NOW, limit=10, created_before=DAY2)
    assert [h.text for h in before] == ["Deployed the gateway to the staging server."]
    # created_after is inclusive, created_before exclusive (DAY1 00:00 exactly)
    assert len(idx.search("staging", now=NOW, created_after=DAY1)) == 1
    assert idx.search("staging", now=NOW, created_before=DAY1) == []
    after = idx.search("gateway", now=NOW, limit=10, created_after=DAY3)
    assert [h.path for h in after] == ["memory/2026-01-03.md"]


def test_decay_ordering_flips_with_lambda(tmp_path):
    _write(tmp_path / "memory" / "2026-01-01.md", "Kafka kafka kafka cluster migration notes.\n")
    _write(tmp_path / "memory" / "2026-01-03.md", "Kafka mentioned once in passing today.\n")
    idx = MemoryIndex(tmp_path, tz=TZ)
    flat = idx.search("kafka", now=NOW, decay_lambda=0.0)
    assert [h.path for h in flat] == ["memory/2026-01-01.md", "memory/2026-01-03.md"]
    decayed = idx.search("kafka", now=NOW, decay_lambda=0.1)
    assert [h.path for h in decayed] == ["memory/2026-01-03.md", "memory/2026-01-01.md"]
    # relevance is the undecayed BM25 score either way
    assert {h.path: h.relevance for h in flat} == {h.path: h.relevance for h in decayed}


@pytest.mark.parametrize(("lam", "factor"), [(0.0, 1.0), (0.5, math.exp(-0.5)),
                                             (1.0, math.exp(-1.0))])
def test_exact_decay_factor_after_one_hour(tmp_path, lam, factor):
    clock = FakeClock(DAY2)
    _write(tmp_path / "memory" / "2026-01-02.md", "Quarterly report draft finished.\n")
    idx = MemoryIndex(tmp_path, tz=TZ)
    hit, = idx.search("report", now=clock.time(), decay_lambda=lam)
    assert hit.score == pytest.approx(hit.relevance)  # Δt = 0
    clock._now += 3600  # one hour later
    hit, = idx.search("report", now=clock.time(), decay_lambda=lam)
    assert hit.score / hit.relevance == pytest.approx(factor, rel=1e-12)
    if lam == 0.5:
        assert round(hit.score / hit.relevance, 3) == 0.607  # seed 002: ~60.7 % after 1 h
    # notes dated in the future are not boosted
    hit, = idx.search("report", now=DAY2 - 7200, decay_lambda=lam)
    assert hit.score == pytest.approx(hit.relevance)


def test_empty_workspace(tmp_path):
    idx = MemoryIndex(tmp_path / "missing", tz=TZ)
    assert idx.search("anything", now=NOW) == []
    (tmp_path / "ws" / "memory").mkdir(parents=True)
    _write(tmp_path / "ws" / "MEMORY.md", "# Only a heading\n\n\n")
    assert MemoryIndex(tmp_path / "ws").search("heading", now=NOW) == []
    _write(tmp_path / "ws" / "MEMORY.md", "The and of.\n")  # only stop words: nothing to index
    assert MemoryIndex(tmp_path / "ws").search("heading", now=NOW) == []
    _write(tmp_path / "ws" / "memory" / "2026-13-45.md", "Odd name, still indexed.\n", mtime=DAY2)
    hit, = MemoryIndex(tmp_path / "ws").search("indexed", now=NOW)
    assert hit.created_at == DAY2  # not a real date: file mtime


def test_index_cached_and_rebuilt_only_when_a_file_changes(ws):
    idx = MemoryIndex(ws, tz=TZ)
    idx.search("gateway", now=NOW)
    idx.search("tea", now=NOW)
    assert idx.builds == 1
    note = ws / "memory" / "2026-01-03.md"
    _write(note, "- [09:15] Coffee with Bob about the gateway.\n\nRetro about flaky tests.\n")
    assert [h.text for h in idx.search("flaky", now=NOW)] == ["Retro about flaky tests."]
    assert idx.builds == 2
    idx.search("flaky", now=NOW)
    assert idx.builds == 2
    # same size, new mtime: rebuilt
    stat = note.stat()
    text = note.read_text().replace("flaky", "FLAKY")
    _write(note, text, mtime=stat.st_mtime + 5)
    idx.search("flaky", now=NOW)
    assert idx.builds == 3
    # new file and deleted file
    _write(ws / "memory" / "2026-01-04.md", "Flaky again.\n")
    assert len(idx.search("flaky", now=NOW)) == 2 and idx.builds == 4
    note.unlink()
    assert [h.path for h in idx.search("flaky", now=NOW)] == ["memory/2026-01-04.md"]
    assert idx.builds == 5


def test_bad_input(ws):
    idx = MemoryIndex(ws, tz=TZ)
    for query in ("", "   ", "the and of"):
        with pytest.raises(ValueError, match="no searchable words"):
            idx.search(query, now=NOW)
    with pytest.raises(ValueError, match="limit"):
        idx.search("gateway", now=NOW, limit=0)
    with pytest.raises(ValueError, match="decay_lambda"):
        idx.search("gateway", now=NOW, decay_lambda=-1)
    with pytest.raises(ValueError, match="earlier"):
        idx.search("gateway", now=NOW, created_after=DAY3, created_before=DAY2)


def test_tokenize():
    assert tokenize("The Gateway's HEARTBEAT, v2!") == ["gateway", "s", "heartbeat", "v2"]
    assert tokenize("时间轴") == ["时", "间", "轴", "时间", "间轴"]


async def test_tool_spec_and_runner(ws):
    assert MEMORY_SEARCH_TOOL.name == "memory_search"
    props = MEMORY_SEARCH_TOOL.parameters["properties"]
    assert set(props) == {"query", "created_after", "created_before", "limit"}
    assert MEMORY_SEARCH_TOOL.parameters["required"] == ["query"]

    idx = MemoryIndex(ws, tz=TZ)
    out = json.loads(await run_memory_search_tool(
        idx, {"query": "gateway", "created_after": "2026-01-02", "created_before": "2026-01-03",
              "limit": 1}, now=NOW, decay_lambda=0.5))
    assert len(out["results"]) == 1
    hit = out["results"][0]
    assert hit["path"] == "memory/2026-01-02.md"
    assert hit["created_at"].startswith("2026-01-02T") and hit["created_at"].endswith("Z")
    out = json.loads(await run_memory_search_tool(
        idx, {"query": "gateway", "created_after": "2026-01-02T23:00:00Z"}, now=NOW))
    assert [r["path"] for r in out["results"]] == ["memory/2026-01-03.md"]
    with pytest.raises(ValueError, match="created_after"):
        await run_memory_search_tool(idx, {"query": "x", "created_after": "yesterday"}, now=NOW)
    with pytest.raises(TypeError, match="limit"):
        await run_memory_search_tool(idx, {"query": "x", "limit": "3"}, now=NOW)
