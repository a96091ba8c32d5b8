"""``tidegate storage copy --from embedded --to postgres`` (issue 15 "Migration"): a real
single-host state dir made by the real gateway is copied into PostgreSQL and verified;
the copy is refused while the gateway runs and into a non-empty database; the gateway
then carries on from PostgreSQL with the same sessions and chains."""

from __future__ import annotations

import json
import sqlite3

import yaml

from tests.helpers import GatewayProcess, base_config
from tests.storage_backends import pg_query


def _sqlite(path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_copy_embedded_state_into_postgres_and_carry_on(tmp_path, fake_model, pg_dsn):
    state = tmp_path / "state"
    embedded = base_config(state, fake_model.base_url)
    gp = GatewayProcess(tmp_path, embedded).start()
    try:
        for peer in ("alice", "bob"):
            fake_model.server.script_text(f"hi {peer}")
            gp.agent(f"I am {peer}", "--to", peer)
        gp.agent("/new", "--to", "alice")  # archives alice's first timeline
        fake_model.server.script_text("fresh start")
        alice = gp.agent("hello again", "--to", "alice")["session_id"]
        # a running gateway: the copy is refused and writes nothing
        pg_cfg = base_config(state, fake_model.base_url, storage={
            "backend": "postgres", "dsn": pg_dsn})
        cfg_path = tmp_path / "pg.yaml"
        cfg_path.write_text(yaml.safe_dump(pg_cfg))
        busy = gp.cli("--config", str(cfg_path), "storage", "copy", "--from", "embedded",
                      "--to", "postgres", check=False)
        assert busy.returncode == 1 and "refused" in busy.stderr and "running" in busy.stderr
    finally:
        assert gp.stop() == 0
    assert pg_query(pg_dsn, "SELECT to_regclass('timelines')") == [(None,)]

    (tmp_path / "pg").mkdir()
    on_pg = GatewayProcess(tmp_path / "pg", pg_cfg)
    done = on_pg.cli("storage", "copy", "--from", "embedded", "--to", "postgres", "--json")
    report = json.loads(done.stdout)
    db = state / "timeline.db"
    src_events = _sqlite(db, "SELECT event_id, session_id, seq, timestamp, event_type, "
                             "content, prev_hash, hash FROM timeline_events "
                             "ORDER BY session_id, seq")
    assert report["ok"] and report["events"] == len(src_events) and report["timelines"] == 3
    assert report["sessions"] == {"main": 2} and report["transcripts_checked"] == 2
    files = sorted((state / "agents" / "main" / "sessions").glob("*.jsonl"))
    assert report["transcripts"] == len(files) == 3  # alice's earlier session included
    assert report["transcript_lines"] == sum(f.read_bytes().count(b"\n") for f in files)
    for f in files:  # byte-identical from PostgreSQL alone (the files are moved away)
        exported = on_pg.cli("sessions", "export", f.stem, "-o", str(tmp_path / "x.jsonl"))
        assert "wrote" in exported.stderr
        assert (tmp_path / "x.jsonl").read_bytes() == f.read_bytes()
    alice_file = state / "agents" / "main" / "sessions" / f"{alice}.jsonl"
    before_move = alice_file.read_bytes()
    for f in files:
        f.rename(f.with_suffix(".moved"))
    pg_events = pg_query(pg_dsn, 'SELECT event_id, session_id, seq, "timestamp", '
                                        "event_type, content, prev_hash, hash FROM "
                                        "timeline_events ORDER BY session_id COLLATE \"C\", "
                                        "seq")
    assert pg_events == src_events  # byte for byte, hashes included
    assert sorted(pg_query(pg_dsn, "SELECT status FROM timelines")) == [
        ("active",), ("active",), ("archived",)]
    again = on_pg.cli("storage", "copy", "--from", "embedded", "--to", "postgres",
                      check=False)
    assert again.returncode == 1 and "already has rows" in again.stderr

    # the gateway now runs on PostgreSQL and continues alice's session and chain
    on_pg.start()
    try:
        fake_model.server.script_text("still here")
        assert on_pg.agent("after the move", "--to", "alice")["session_id"] == alice
        exported = on_pg.cli("sessions", "export", "agent:main:cli:dm:alice").stdout
    finally:
        assert on_pg.stop() == 0
    assert exported.encode().startswith(before_move)  # the same file, carried on
    added = [json.loads(x) for x in exported.encode()[len(before_move):].splitlines()]
    assert [e["message"]["role"] for e in added] == ["user", "assistant"]
    assert added[0]["parentId"] == json.loads(before_move.splitlines()[-1])["id"]
    assert not alice_file.exists()  # nothing on disk: the transcript lives in PostgreSQL
    assert "OK: 3 sessions" in on_pg.cli("timeline", "verify").stdout
