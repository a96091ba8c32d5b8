"""The real gateway process on PostgreSQL storage end to end (issue 15): a fake
OpenAI-compatible model, the real CLI, a real PostgreSQL. Sessions and the timeline live
in the database (no sessions.db / timeline.db appear), survive a restart, and the
offline CLI reads them from there."""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.request

from tests.helpers import GatewayProcess, base_config
from tests.storage_backends import pg_query


def _api(gp: GatewayProcess, path: str):
    req = urllib.request.Request(f"http://127.0.0.1:{gp.port}{path}",
                                 headers={"Authorization": f"Bearer {gp.token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _wait_for_log(gp: GatewayProcess, event: str | tuple[str, ...],
                  limit: float = 60.0) -> dict:
    """The first log line of ``event`` (or of any of several; polls the gateway's JSON
    log; fails after ``limit`` s)."""
    events = (event,) if isinstance(event, str) else event
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            hit = next((x for x in gp.log_lines() if x.get("event") in events), None)
        except (OSError, ValueError):  # no file yet, or a line being written
            hit = None
        if hit is not None:
            return hit
        time.sleep(0.05)
    raise AssertionError(f"no {event!r} log line within {limit}s")


def test_gateway_runs_on_postgres(tmp_path, fake_model, pg_dsn):
    state = tmp_path / "state"
    cfg = base_config(state, fake_model.base_url, storage={"backend": "postgres",
                                                           "dsn": pg_dsn})
    gp = GatewayProcess(tmp_path, cfg).start()
    try:
        fake_model.server.script_text("Hello from postgres!")
        out = gp.agent("hi there")
        assert out["reply"] == "Hello from postgres!"
        sid = out["session_id"]
        fake_model.server.script_text("Second.")
        assert gp.agent("again")["session_id"] == sid
        history = _api(gp, "/api/sessions/agent:main:cli:dm:local/messages")
        assert [(m["role"], m["text"]) for m in history] == [
            ("user", "hi there"), ("assistant", "Hello from postgres!"),
            ("user", "again"), ("assistant", "Second.")]
        assert _api(gp, "/api/sessions/agent:main:cli:dm:local")["transcript"] == \
            f"postgresql:transcript_lines/main/{sid}"
    finally:
        assert gp.stop() == 0
    # the transcript lives in PostgreSQL; export writes the file a single host keeps
    assert not (state / "agents" / "main" / "sessions" / f"{sid}.jsonl").exists()
    lines = [r[0] for r in pg_query(pg_dsn, "SELECT line FROM transcript_lines ORDER BY seq")]
    exported = gp.cli("sessions", "export", "agent:main:cli:dm:local").stdout
    assert exported == "".join(x + "\n" for x in lines) and len(lines) == 5
    header, *entries = [json.loads(x) for x in lines]
    assert header["type"] == "session" and header["id"] == sid
    assert [e["parentId"] for e in entries] == [None] + [e["id"] for e in entries[:-1]]
    shown = json.loads(gp.cli("sessions", "show", "agent:main:cli:dm:local", "--json").stdout)
    assert [e["message"]["role"] for e in shown["recent"]] == ["user", "assistant"] * 2
    refused = gp.cli("timeline", "rebuild-transcript", sid, check=False)
    assert refused.returncode == 1 and "has lines and was not touched" in refused.stderr
    rebuilt = tmp_path / "rebuilt.jsonl"
    gp.cli("timeline", "rebuild-transcript", sid, "--out", str(rebuilt))
    assert [json.loads(x)["message"]["content"] for x in rebuilt.read_text().splitlines()[1:]
            ] == [e["message"]["content"] for e in entries]
    # a lost transcript (rows removed behind the triggers' back) is rebuilt into the table
    pg_query(pg_dsn, "DO $$ BEGIN PERFORM set_config('session_replication_role', "
                     "'replica', true); DELETE FROM transcript_lines; END $$")
    done = gp.cli("timeline", "rebuild-transcript", sid)
    assert f"into postgresql:transcript_lines/main/{sid}" in done.stdout
    restored = gp.cli("sessions", "export", sid).stdout
    assert [json.loads(x)["message"]["content"] for x in restored.splitlines()[1:]] == [
        e["message"]["content"] for e in entries]
    rows = pg_query(pg_dsn, "SELECT agent_id, session_key, session_id, "
                                      "entry->>'session_id' FROM sessions")
    assert rows == [("main", "agent:main:cli:dm:local", sid, sid)]
    events = pg_query(pg_dsn, f"SELECT event_type FROM timeline_events "
                                        f"WHERE session_id = '{sid}' ORDER BY seq")
    kinds = [e[0] for e in events]
    assert kinds[0] == "SESSION_CREATE" and kinds.count("USER_INPUT") == 2
    assert kinds.count("LLM_RESPONSE") == 2
    assert not (state / "timeline.db").exists()
    assert not (state / "agents" / "main" / "sessions" / "sessions.db").exists()
    # offline CLI reads the database
    listed = json.loads(gp.cli("sessions", "list", "--json").stdout)
    assert [r["session_id"] for r in listed] == [sid]
    verify = gp.cli("timeline", "verify")
    assert "OK: 1 session," in verify.stdout
    findings = json.loads(gp.cli("doctor", "--json", check=False).stdout)
    timeline = [f for f in findings if f["check"] == "timeline"]
    assert timeline == [{**timeline[0], "severity": "ok"}]
    assert "1 most recent timelines verified (PostgreSQL)" in timeline[0]["message"]
    # a restart continues the same session from the database
    gp.start()
    try:
        fake_model.server.script_text("Third.")
        assert gp.agent("after restart")["session_id"] == sid
    finally:
        assert gp.stop() == 0
    assert len(pg_query(pg_dsn, f"SELECT 1 FROM timeline_events WHERE session_id "
                                          f"= '{sid}' AND event_type = 'USER_INPUT'")) == 3


def test_gateway_rides_out_a_database_outage(tmp_path, fake_model, pg_dsn, pg_server):
    """PostgreSQL stops under a running gateway and comes back a few seconds later: the
    turn sent during the outage waits for the database to store its user line before
    the model call, then gets its reply, its timeline events written; later turns write to it again without a restart
    (asyncpg pools reconnect); the chain stays valid."""
    cfg = base_config(tmp_path / "state", fake_model.base_url, storage={
        "backend": "postgres", "dsn": pg_dsn, "pool": {"connect_timeout": "2s"}})
    gp = GatewayProcess(tmp_path, cfg).start()
    try:
        fake_model.server.script_text("before")
        sid = gp.agent("one")["session_id"]
        pg_server.stop()
        try:
            fake_model.server.script_text("during")
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                during = pool.submit(gp.agent, "two")
                # it waits, not fails: the message enters the shared work queue (the
                # lane's intake) and its user line is stored before the model call
                _wait_for_log(gp, ("cluster_waiting_for_postgres",
                                   "transcript_database_unreachable"))
                assert not during.done()
                pg_server.start()
                assert during.result(timeout=60)["reply"] == "during"
        finally:
            pg_server.start()
        fake_model.server.script_text("after")
        assert gp.agent("three")["session_id"] == sid
    finally:
        assert gp.stop() == 0
    texts = pg_query(pg_dsn, f"SELECT content FROM timeline_events WHERE "
                                       f"session_id = '{sid}' AND event_type = 'USER_INPUT' "
                                       "ORDER BY seq")
    assert [json.loads(t[0])["text"] for t in texts] == ["one", "two", "three"]
    assert "OK: 1 session," in gp.cli("timeline", "verify").stdout
