"""``tidegate timeline`` against timelines the real gateway wrote (issue 5 "How it is proven").

The gateway runs in-process on a FakeClock with the fake OpenAI server; the CLI runs as
``gateway.cli.main`` in a worker thread (it has its own event loop) and reads the database
read-only, as it would beside a running daemon. The kill -9 proof runs the daemon as a real
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import sqlite3
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from runtime.clock import FakeClock
from runtime.timeline.pending import newer_events, read_pending
from scheduler.cron.job import new_job
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import GatewayProcess, base_config, running_gateway

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
KEY = "agent:main:cli:dm:local"


async def tidegate(capsys, config: Path, *args: str) -> tuple[int, str, str]:
    """Run ``tidegate --config CONFIG ARGS`` in-process; (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["--config", str(config), *args])
    out, err = capsys.readouterr()
    return code, out, err


def write_config(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


async def two_turns(tmp_path: Path, fake: FakeOpenAI, tz: str = "Asia/Tokyo"):
    """A turn with a tool call, 65 s later a plain turn; returns (config path, session id)."""
    cfg = base_config(tmp_path / "state", fake.base_url,
                      agents={"defaults": {"model": "fake/fake-model", "user_timezone": tz}})
    clock = FakeClock(T0)
    async with running_gateway(cfg, clock=clock) as gw:
        fake.script_tool_call("write", {"path": "a.txt", "content": "hi"}, call_id="c1",
                              text="Writing it.")
        fake.script_text("Done.")
        r1 = await gw.local.send("make a.txt")
        await clock.advance(65)
        fake.script_text("Second answer.")
        await gw.local.send("again")
    return write_config(tmp_path, cfg), r1.session_id


def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


async def async_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


# ---- show / list / replay ------------------------------------------------------------------


async def test_list_and_show_with_filters(tmp_path, capsys):
    async with FakeOpenAI() as fake:
        config, sid = await two_turns(tmp_path, fake)

    code, out, _ = await tidegate(capsys, config, "timeline", "list", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [(r["session_id"], r["session_key"], r["status"], r["event_count"]) for r in rows] \
        == [(sid, KEY, "active", 10)]
    assert rows[0]["created_at"] == "2026-01-01T00:00:00.000Z"

    # a session key resolves to its latest timeline; text output is in the user's timezone
    code, out, _ = await tidegate(capsys, config, "timeline", "show", KEY)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (f"Session {KEY} ({sid}), active, 10 events; showing 10; "
                        "times in Asia/Tokyo")
    assert lines[1].startswith("#1     2026-01-01 09:00:00.000 JST  SESSION_CREATE")
    assert "USER_INPUT" in lines[2] and "user[local]: make a.txt" in lines[2]
    # each message's OUTCOME is written once it is recorded, stamped when it happened
    assert lines[7].startswith("#7     2026-01-01 09:00:00.000 JST  OUTCOME")
    assert lines[8].startswith("#8     2026-01-01 09:01:05.000 JST  USER_INPUT")

    code, out, _ = await tidegate(capsys, config, "timeline", "show", sid, "--json",
                                  "--type", "tool_call,TOOL_RESULT")
    body = json.loads(out)
    assert code == 0 and body["session_id"] == sid
    assert [(e["seq"], e["event_type"]) for e in body["events"]] == [
        (4, "TOOL_CALL"), (5, "TOOL_RESULT")]
    assert body["events"][0]["content"] == {"id": "c1", "name": "write",
                                            "arguments": {"path": "a.txt", "content": "hi"}}
    assert body["events"][1]["time"] == "2026-01-01T00:00:00.000Z"

    # --since: RFC 3339 keeps the second turn only; a relative window keeps everything
    code, out, _ = await tidegate(capsys, config, "timeline", "show", KEY, "--json",
                                  "--since", "2026-01-01T09:01:00+09:00")
    assert [e["seq"] for e in json.loads(out)["events"]] == [8, 9, 10]
    code, out, _ = await tidegate(capsys, config, "timeline", "show", KEY, "--json",
                                  "--since", "100000d")
    assert len(json.loads(out)["events"]) == 10

    code, _, err = await tidegate(capsys, config, "timeline", "show", KEY, "--type", "CHAT")
    assert code == 2 and "unknown event type(s) CHAT" in err
    code, _, err = await tidegate(capsys, config, "timeline", "show", KEY, "--since", "soon")
    assert code == 2 and "--since" in err
    code, _, err = await tidegate(capsys, config, "timeline", "show", "agent:main:nobody:x")
    assert code == 1 and "no timeline for session id or session key" in err


async def test_replay_plays_turns_step_by_step_in_user_timezone(tmp_path, capsys):
    async with FakeOpenAI() as fake:
        config, sid = await two_turns(tmp_path, fake)
    code, out, _ = await tidegate(capsys, config, "timeline", "replay", sid)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == f"Session {KEY} ({sid}), active, 10 events; times in Asia/Tokyo"
    assert lines[1] == "2026-01-01 09:00:00.000 JST  SESSION_CREATE session " + KEY
    turn1 = lines.index(next(x for x in lines if x.startswith("Turn 1 ")))
    assert lines[turn1].startswith("Turn 1 (user) — 2026-01-01 09:00:00.000 JST, took 0ms; "
                                   "2 model calls (")
    assert ", 1 tool call (" in lines[turn1]
    body = "\n".join(lines[turn1:])
    for expected in ("  09:00:00.000 +0ms      user [local]:\n" + " " * 25 + "make a.txt",
                     "→ calls write:\n" + " " * 25 + "Writing it.",
                     "tool call write [c1]\n" + " " * 25 + '{"content": "hi", "path": "a.txt"}',
                     "tool result write ok, ",
                     " " * 25 + "wrote 2 bytes to a.txt",
                     "Turn 2 (user) — 2026-01-01 09:01:05.000 JST",
                     "  09:01:05.000 +0ms      user [local]:\n" + " " * 25 + "again"):
        assert expected in body, expected
    code, out, _ = await tidegate(capsys, config, "timeline", "replay", sid, "--tz", "UTC")
    assert "Turn 2 (user) — 2026-01-01 00:01:05.000 UTC" in out
    code, _, err = await tidegate(capsys, config, "timeline", "replay", sid, "--tz", "Mars/Base")
    assert code == 2 and "unknown IANA timezone" in err


# ---- export, verify, tamper ----------------------------------------------------------------


async def test_export_then_offline_verify_through_cli(tmp_path, capsys):
    async with FakeOpenAI() as fake:
        config, sid = await two_turns(tmp_path, fake)
    export = tmp_path / "export.jsonl"
    code, out, err = await tidegate(capsys, config, "timeline", "export", KEY, "--format",
                                    "jsonl", "-o", str(export))
    assert code == 0 and "exported 10 events" in err and out == ""
    lines = export.read_text().splitlines()
    assert json.loads(lines[0])["type"] == "timeline_export" and len(lines) == 11

    # offline: no config, no database needed
    (tmp_path / "state" / "timeline.db").rename(tmp_path / "moved.db")
    code, out, _ = await tidegate(capsys, config, "timeline", "verify", "--file", str(export))
    assert code == 0 and out.strip() == f"{export}: OK: 1 session, 10 events verified"

    events = [json.loads(x) for x in lines]
    events[6]["content"]["text"] = "Done!"  # the final answer of turn 1 (seq 6)
    export.write_text("\n".join(json.dumps(e, ensure_ascii=False) for e in events) + "\n")
    code, out, _ = await tidegate(capsys, config, "timeline", "verify", "--file", str(export))
    assert code == 1
    assert f"BROKEN at line 7: session {sid} seq 6 event {events[6]['event_id']}: " \
           "hash mismatch" in out

    # stdout export of the same session is the same bytes as the file it wrote
    (tmp_path / "moved.db").rename(tmp_path / "state" / "timeline.db")
    code, out, _ = await tidegate(capsys, config, "timeline", "export", sid)
    assert code == 0 and out.splitlines()[1:] == lines[1:]


@pytest.mark.parametrize("column,assignment", [
    ("content", "replace(content, 'hi', 'ho')"),
    ("timestamp", "timestamp + 1"),
    ("event_type", "'SYSTEM_EVENT'"),
])
async def test_verify_fails_at_the_tampered_event(tmp_path, capsys, column, assignment):
    async with FakeOpenAI() as fake:
        config, sid = await two_turns(tmp_path, fake)
    code, out, _ = await tidegate(capsys, config, "timeline", "verify")
    assert code == 0 and out.strip() == "OK: 1 session, 10 events verified"

    db = sqlite3.connect(tmp_path / "state" / "timeline.db")
    with pytest.raises(sqlite3.DatabaseError, match="UPDATE refused"):
        db.execute(f"UPDATE timeline_events SET {column} = {assignment} WHERE seq = 4")
    db.execute("DROP TRIGGER timeline_events_no_update")
    db.execute(f"UPDATE timeline_events SET {column} = {assignment} WHERE seq = 4")
    db.commit()
    db.close()

    for args in (("timeline", "verify"), ("timeline", "verify", KEY)):
        code, out, _ = await tidegate(capsys, config, *args)
        assert code == 1, out
        first, second = out.splitlines()
        assert first.startswith(f"BROKEN at session {sid} seq 4 event ")
        assert ": hash mismatch (stored " in first
        assert second.startswith(f"first broken event: session {sid} seq 4 ")


async def test_missing_database_and_bad_usage(tmp_path, capsys):
    config = write_config(tmp_path, base_config(tmp_path / "state"))
    code, _, err = await tidegate(capsys, config, "timeline", "verify")
    assert code == 1 and "no timeline database at" in err
    assert not (tmp_path / "state" / "timeline.db").exists()  # the CLI never creates it
    code, _, err = await tidegate(capsys, config, "timeline", "verify", "x", "--file", "f")
    assert code == 2 and "not both" in err
    code, _, err = await tidegate(capsys, config, "timeline", "verify", "--file",
                                  str(tmp_path / "nope.jsonl"))
    assert code == 1 and "No such file" in err


# ---- rebuild-transcript, with heartbeat, cron and system events in the session ------------


def _messages(path: Path) -> list[dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [{k: v for k, v in e["message"].items() if k != "api"}
            for e in lines if e["type"] == "message"]


async def test_rebuild_transcript_matches_original_and_the_session_continues(tmp_path, capsys):
    state = tmp_path / "state"
    workspace = state / "workspace" / "main"
    workspace.mkdir(parents=True)
    (workspace / "HEARTBEAT.md").write_text("# Heartbeat\n- check the build\n")
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        cfg = base_config(state, fake.base_url, session={"dm_scope": "main"},
                          agents={"defaults": {"model": "fake/fake-model",
                                               "heartbeat": {"every": "30m"}}})
        config = write_config(tmp_path, cfg)
        async with running_gateway(cfg, clock=clock) as gw:
            fake.script_tool_call("write", {"path": "notes.txt", "content": "42"}, call_id="c1",
                                  text="Writing.")
            fake.script_text("Done.")
            r1 = await gw.local.send("make notes.txt")
            sid, key = r1.session_id, r1.session_key
            assert key == "agent:main:main"
            await clock.advance(60)
            fake.script_text("Noted: 42.")
            await gw.local.send("remember 42")

            def beats() -> list:
                return gw.scheduling.heartbeat.outcomes

            fake.script_text("HEARTBEAT_OK")  # an ack: no transcript trace
            await clock.advance(1800)
            await async_until(lambda: len(beats()) == 1)
            await gw.scheduling.cron.add(new_job(
                name="standup", schedule={"kind": "at", "at": clock.time() + 60},
                message="stand-up time", now=clock.time()))
            fake.script_text("Reminder: stand-up time.")  # an alert: kept
            await clock.advance(61)
            await clock.advance(1)  # the heartbeat's wake coalescing
            await async_until(lambda: len(beats()) == 2)
            assert [(b.outcome, b.reason) for b in beats()] == [("ok", None),
                                                              ("alert", "target_none")]
            await gw.timeline_hooks.flush()
            events = await gw.timeline_hooks.timeline.get_timeline(sid)

        # the timeline holds everything, the acked beat and its marker included
        def kind(e) -> tuple:
            c = e.content
            detail = c.get("outcome") if e.event_type == "HEARTBEAT" else \
                c.get("source") or c.get("trigger")
            return e.event_type, detail

        kinds = [kind(e) for e in events]
        assert kinds == [
            ("SESSION_CREATE", None), ("SYSTEM_EVENT", "restart"),
            ("USER_INPUT", None), ("LLM_RESPONSE", None), ("TOOL_CALL", None),
            ("TOOL_RESULT", None), ("LLM_RESPONSE", None), ("OUTCOME", None),
            ("USER_INPUT", None), ("LLM_RESPONSE", None), ("OUTCOME", None),
            ("USER_INPUT", "heartbeat"), ("LLM_RESPONSE", None), ("SYSTEM_EVENT", "gateway"),
            ("HEARTBEAT", "ok"),
            ("CRON_RUN", None), ("SYSTEM_EVENT", f"cron:{events[15].content['job_id']}"),
            ("USER_INPUT", "heartbeat"), ("LLM_RESPONSE", None), ("HEARTBEAT", "alert")]
        assert events[13].content["transcript"] == "discarded"

        transcript = state / "agents" / "main" / "sessions" / f"{sid}.jsonl"
        original = _messages(transcript)
        assert [m["role"] for m in original] == ["user", "assistant", "toolResult", "assistant",
                                                 "user", "assistant", "user", "assistant"]
        assert [m["content"][0]["text"] for m in original if m["role"] == "assistant"] == [
            "Writing.", "Done.", "Noted: 42.", "Reminder: stand-up time."]
        header = json.loads(transcript.read_text().splitlines()[0])

        transcript.unlink()  # lost
        code, out, _ = await tidegate(capsys, config, "timeline", "rebuild-transcript", key)
        assert code == 0 and f"rebuilt 8 messages from 20 timeline events of {sid}" in out
        assert _messages(transcript) == original
        rebuilt_header = json.loads(transcript.read_text().splitlines()[0])
        assert {k: rebuilt_header[k] for k in ("type", "version", "id", "session_key", "cwd")} \
            == {k: header[k] for k in ("type", "version", "id", "session_key", "cwd")}
        assert rebuilt_header["timestamp"] == "2026-01-01T00:00:00.000Z"

        # never over an existing transcript; --out writes elsewhere
        before = transcript.read_bytes()
        code, _, err = await tidegate(capsys, config, "timeline", "rebuild-transcript", sid)
        assert code == 1 and "exists and was not touched; pass --out" in err
        assert transcript.read_bytes() == before
        other = tmp_path / "copy.jsonl"
        code, _, _ = await tidegate(capsys, config, "timeline", "rebuild-transcript", sid,
                                    "--out", str(other))
        assert code == 0 and _messages(other) == original
        assert not list(transcript.parent.glob(".*.tmp"))

        # a restarted gateway continues the session with the rebuilt context
        async with running_gateway(cfg, clock=FakeClock(clock.time() + 10)) as gw:
            fake.script_text("It was 42.")
            r = await gw.local.send("which number?")
            assert r.session_id == sid and r.text == "It was 42."
        sent = fake.requests[-1].json["messages"]
        texts = [m.get("content") for m in sent]
        assert sent[0]["role"] == "system"
        assert [m["role"] for m in sent[1:]] == ["user", "assistant", "tool", "assistant",
                                                 "user", "assistant", "user", "assistant",
                                                 "user"]
        assert sent[2]["tool_calls"][0]["id"] == "c1" and sent[3]["tool_call_id"] == "c1"
        assert "remember 42" in texts and "Noted: 42." in texts
        assert "Reminder: stand-up time." in texts and "HEARTBEAT_OK" not in texts
        code, out, _ = await tidegate(capsys, config, "timeline", "verify")
        assert code == 0, out


# ---- kill -9 during a burst of turns -------------------------------------------------------


def _post(port: int, token: str, body: dict) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/agent", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    # the daemon is killed mid-request on purpose
    with contextlib.suppress(OSError, http.client.HTTPException):
        urllib.request.urlopen(req, timeout=10).read()


def _events_in(db: Path) -> int:
    """Acknowledged events: committed to timeline.db or still in its pending log."""
    if not db.exists():
        return 0
    pending = read_pending(str(db) + "-pending")  # before the database: misses nothing
    conn = sqlite3.connect(db)
    try:
        committed = conn.execute("SELECT count(*) FROM timeline_events").fetchone()[0]
        heads = dict(conn.execute("SELECT session_id, last_seq FROM timelines"))
    except sqlite3.Error:
        return 0
    finally:
        conn.close()
    return committed + sum(len(newer_events(pending, sid, heads.get(sid, 0)))
                           for sid in pending.events)


def test_kill_9_during_a_burst_of_turns_leaves_verify_green(tmp_path):
    fake = FakeOpenAI.start_in_thread(latency=0.005)

    def respond(body: dict) -> dict | str:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return "written"
        n = len(body["messages"])
        return {"type": "tool_calls", "calls": [
            {"name": "write", "arguments": {"path": f"f{n}.txt", "content": "x" * 100}}]}

    fake.server.responder = respond
    gp = GatewayProcess(tmp_path, base_config(tmp_path / "state", fake.base_url))
    try:
        gp.start()
        db = gp.state_dir / "timeline.db"
        threads = [threading.Thread(target=_post, daemon=True, args=(
            gp.port, gp.token, {"message": f"burst {i}", "to": f"peer{i % 12}"}))
            for i in range(60)]
        for t in threads:
            t.start()
        until(lambda: _events_in(db) >= 60)
        in_flight = sum(t.is_alive() for t in threads)
        gp.kill9()
        assert in_flight > 0  # killed during the burst, not after it
        written = _events_in(db)
        assert written >= 60

        r = gp.cli("timeline", "verify", check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.startswith("OK: ") and "sessions" in r.stdout
        rows = json.loads(gp.cli("timeline", "list", "--json").stdout)
        assert sum(row["event_count"] for row in rows) == written

        # the restarted daemon appends to the same chains, which stay valid
        gp.start()
        out = gp.agent("after the crash", "--to", "peer0")
        assert out["status"] == "ok"
        gp.stop()
        r = gp.cli("timeline", "verify", check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert _events_in(db) > written
    finally:
        if gp.proc is not None and gp.proc.poll() is None:
            gp.kill9()
        fake.stop()


async def test_rebuild_in_place_refuses_while_the_gateway_runs(tmp_path, capsys):
    state = tmp_path / "state"
    cfg = base_config(state)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    async with running_gateway(cfg) as gw:
        r = await gw.local.send("hello")
        await gw.timeline_hooks.flush()
        transcript = state / "agents" / "main" / "sessions" / f"{r.session_id}.jsonl"
        transcript.unlink()
        code, _, err = await tidegate(capsys, config, "timeline", "rebuild-transcript",
                                      r.session_id)
        assert code == 1 and "gateway is running" in err
        assert not transcript.exists()
