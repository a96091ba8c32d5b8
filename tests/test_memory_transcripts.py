"""memory.index_transcripts: DM transcripts are searchable in the scope of the person the
DM is with, never in another user's; group transcripts are never indexed; a grown
transcript is read from where the last read stopped and only its new lines are embedded
(the fake embeddings endpoint counts them); off by default."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.config.load import parse_config
from gateway.memory.hub import MemoryHub
from runtime.clock import SYSTEM_CLOCK
from runtime.memory.keyword import Query
from runtime.memory.scopes import Asker
from tests.fakes.fake_embeddings import FakeEmbeddings
from tests.helpers import base_config

pytestmark = pytest.mark.timeout(30)

CONCEPTS = [{"locker", "cabinet", "storage"}, {"allergy", "peanuts", "nuts"},
            {"sister", "brother", "sibling"}]
NOW = 1_790_000_000.0


def write_transcript(sessions: Path, sid: str, key: str, turns: list[tuple[str, str]],
                     *, append: bool = False) -> None:
    lines = [] if append else [{"type": "session", "version": 3, "id": sid,
                                "timestamp": "2026-09-21T10:00:00.000Z", "session_key": key}]
    for i, (role, text) in enumerate(turns):
        lines.append({"type": "message", "id": f"{sid[:4]}{i:04x}", "parentId": None,
                      "timestamp": "2026-09-21T10:00:00.000Z",
                      "message": {"role": role, "content": [{"type": "text", "text": text}],
                                  "timestamp": int(NOW * 1000) - 3_600_000}})
    sessions.mkdir(parents=True, exist_ok=True)
    with open(sessions / f"{sid}.jsonl", "a") as fh:
        fh.write("".join(json.dumps(x) + "\n" for x in lines))


def hub_for(state: Path, emb: FakeEmbeddings | None, index: bool = True) -> MemoryHub:
    memory = {"index_transcripts": index}
    if emb is not None:
        memory["embeddings"] = {"provider": "emb", "model": "m1"}
    cfg = base_config(state, memory=memory)
    if emb is not None:
        cfg["models"] = {"providers": {"emb": {"api": "openai", "base_url": emb.base_url}}}
    (state / "workspace" / "main").mkdir(parents=True, exist_ok=True)
    return MemoryHub(parse_config(cfg, "t", env={}).config, state, SYSTEM_CLOCK)


async def texts(hub: MemoryHub, query: str, asker: Asker | None) -> list[str]:
    scopes = None if asker is None else asker.visible()
    found = await hub.search_for("main").search(query, Query(NOW, scopes=scopes), 5)
    return [h.text for h in found.hits]


def seed(state: Path) -> Path:
    sessions = state / "agents" / "main" / "sessions"
    write_transcript(sessions, "s-ann", "agent:main:telegram:dm:4242", [
        ("user", "my locker number is 31"), ("assistant", "Noted: locker 31.")])
    write_transcript(sessions, "s-bob", "agent:main:telegram:dm:777", [
        ("user", "I have a peanuts allergy")])
    write_transcript(sessions, "s-grp", "agent:main:telegram:group:-100123", [
        ("user", "Ann: my sister lives in Graz")])
    return sessions


async def test_dm_transcripts_stay_in_their_person_scope(tmp_path):
    emb = await FakeEmbeddings(CONCEPTS).start()
    try:
        state = tmp_path / "state"
        sessions = seed(state)
        hub = hub_for(state, emb)
        ann = Asker("telegram:4242", "telegram:-100123")
        bob = Asker("telegram:777", "telegram:-100123")
        # by meaning ("cabinet" is no word of the note), in Ann's scope only
        ANN = {"my locker number is 31", "Noted: locker 31."}
        assert set((await texts(hub, "which cabinet is mine", ann))[:2]) == ANN
        # the nearest vectors always answer something: never the other person's lines
        assert not ANN & set(await texts(hub, "which cabinet is mine", bob))
        assert (await texts(hub, "nuts", bob))[0] == "I have a peanuts allergy"
        assert "I have a peanuts allergy" not in await texts(hub, "nuts", ann)
        # a group transcript is never indexed: not for its members, not for the operator
        for who in (ann, bob, None):
            assert "Ann: my sister lives in Graz" not in await texts(hub, "sibling Graz", who)
        [hit] = (await hub.search_for("main").search("locker", Query(
            NOW, scopes=ann.visible()), 1)).hits
        assert (hit.path, hit.scope) == ("transcripts/s-ann.jsonl", "user:telegram:4242")
        assert (hit.line, hit.heading) in ((2, "user"), (3, "assistant"))
        # the transcript grows: only its new lines are read and embedded
        assert not [t for r in emb.requests for t in r if "lives in Graz" in t]  # not embedded
        source = hub.search_for("main").keyword.transcripts
        read, before = source.bytes_read, (sessions / "s-ann.jsonl").stat().st_size
        emb.requests.clear()
        write_transcript(sessions, "s-ann", "", [("user", "also my brother is Tom"),
                                                 ("assistant", "Tom, your brother.")],
                         append=True)
        assert "also my brother is Tom" in await texts(hub, "sibling", ann)
        new_inputs = [t for r in emb.requests for t in r]
        assert sorted(new_inputs) == ["assistant\nTom, your brother.", "sibling",
                                      "user\nalso my brother is Tom"]
        assert source.bytes_read - read == (sessions / "s-ann.jsonl").stat().st_size - before
        assert "also my brother is Tom" not in await texts(hub, "brother", bob)
        await hub.close()
    finally:
        await emb.stop()


async def test_transcripts_are_not_searched_unless_asked(tmp_path):
    state = tmp_path / "state"
    seed(state)
    hub = hub_for(state, None, index=False)
    assert await texts(hub, "locker", None) == []
    on = hub_for(state, None)  # BM25 only: the transcripts are searched too
    assert set(await texts(on, "locker", Asker("telegram:4242"))) == {
        "my locker number is 31", "Noted: locker 31."}
    assert await texts(on, "locker", Asker("telegram:777")) == []
    assert on.transcript_scope("agent:main:main") is None
    assert on.transcript_scope("agent:main:dm:4242") is None  # per-peer: no channel
    assert on.transcript_scope("agent:main:cli:dm:local") is None
    # the peer unescaped, then canonical as for the live sender (the same scope)
    assert on.transcript_scope("agent:main:slack:t1:dm:u%3a1") == \
        f"user:{on.canonical('slack', 'U:1')}" == "user:slack:u:1"


async def test_transcripts_in_postgres_are_indexed_alike(tmp_path, pg_dsn):
    """On PostgreSQL storage the lines come from transcript_lines: same scopes, and a
    grown transcript is read from its next seq on."""
    from runtime.storage.postgres.bridge import SyncBridge
    from tests.storage_backends import pg_query
    from tests.test_memory_postgres import migrated
    files = seed(tmp_path / "files")  # the same three transcripts, as rows

    def insert(sid: str, lines: list[str], start: int) -> None:
        values = ", ".join(f"('main', '{sid}', {start + i}, NULL, "
                           f"'{line.replace(chr(39), chr(39) * 2)}')"
                           for i, line in enumerate(lines))
        pg_query(pg_dsn, "INSERT INTO transcript_lines (agent_id, session_id, seq, "
                         f"entry_id, line) VALUES {values}")
    def setup() -> None:  # pg_query runs its own event loop: in a thread
        migrated(pg_dsn)
        pg_query(pg_dsn, "SELECT transcript_partition('main')")
        for sid in ("s-ann", "s-bob", "s-grp"):
            insert(sid, (files / f"{sid}.jsonl").read_text().splitlines(), 0)
    await asyncio.to_thread(setup)
    state = tmp_path / "state"
    door = SyncBridge(pg_dsn)
    try:
        cfg = base_config(state, memory={"index_transcripts": True},
                          storage={"backend": "postgres", "dsn": pg_dsn})
        (state / "workspace" / "main").mkdir(parents=True)
        hub = MemoryHub(parse_config(cfg, "t", env={}).config, state, SYSTEM_CLOCK,
                        bridge=lambda: door)
        ann, bob = Asker("telegram:4242"), Asker("telegram:777")
        search = hub.search_for("main")
        q = lambda a: Query(NOW, scopes=a.visible())
        hits = (await search.search("locker", q(ann))).hits
        assert {h.text for h in hits} == {"my locker number is 31", "Noted: locker 31."}
        assert {h.path for h in hits} == {"transcripts/s-ann.jsonl"}
        assert (await search.search("locker", q(bob))).hits == []
        assert (await search.search("Graz", Query(NOW))).hits == []  # the group's
        source = search.keyword.transcripts
        read = source.lines_read
        write_transcript(tmp_path / "more", "s-ann", "", [("user", "my locker moved to 40")],
                         append=True)
        await asyncio.to_thread(insert, "s-ann", (tmp_path / "more" / "s-ann.jsonl")
                                .read_text().splitlines(), 3)
        texts_now = {h.text for h in (await search.search("locker", q(ann))).hits}
        assert "my locker moved to 40" in texts_now and source.lines_read - read == 1
    finally:
        door.close()

