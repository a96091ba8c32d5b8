"""``backup create`` of a serving gateway is one instant (gateway/backup/cut.py): a real
gateway (built-in echo model) serves turns in eight sessions without pause while the CLI
makes three backups through it; every archive verifies and restores, and in every
restored state dir the transcripts, sessions.db and the timeline agree.

The state dir also holds the transcripts of 150 old sessions, whose names sort first:
copying them takes long enough that files read one after another (the path without a
running gateway) come from visibly different instants, which is what this test catches.

What "agree" means for this workload (one message per turn, no tools, no crash): per
session, the transcript holds at most ONE turn more than the timeline (the turn in flight
at the cut: its lines are written before its events are recorded) and never fewer;
sessions.db counts no more turns than the transcript holds; a session with counted turns
or recorded input has its transcript.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections import Counter
from pathlib import Path

import yaml

from gateway.backup.check import peek_manifest, restore, verify_archive
from gateway.cli.main import main as cli
from runtime.timeline.pending import read_pending
from tests.helpers import base_config, running_gateway

OLD_SESSIONS = 150
SESSIONS = 8


def old_transcripts(folder: Path, lines: int = 20) -> None:
    """The transcripts of :data:`OLD_SESSIONS` old sessions (``lines`` messages each)."""
    for n in range(OLD_SESSIONS):
        sid = f"00000000-0000-4000-8000-{n:012d}"
        head = {"type": "session", "version": 3, "id": sid,
                "timestamp": "2026-01-01T00:00:00.000Z", "session_key": f"agent:main:old{n}"}
        body = [json.dumps({"type": "message", "id": f"{i:08x}", "parentId": None,
                            "timestamp": "2026-01-01T00:00:00.000Z",
                            "message": {"role": "user", "content": [
                                {"type": "text", "text": f"old line {i} " + "lorem " * 30}],
                                "timestamp": 1767225600000}}) for i in range(lines)]
        (folder / f"{sid}.jsonl").write_text("\n".join([json.dumps(head), *body]) + "\n")


def transcript_counts(sessions: Path) -> dict[str, Counter]:
    out = {}
    for p in sessions.glob("*.jsonl"):
        c: Counter = Counter()
        for raw in p.read_bytes().splitlines():
            entry = json.loads(raw)
            if entry.get("type") == "message":
                c[entry["message"]["role"]] += 1
        out[p.stem] = c
    return out


def timeline_counts(state: Path) -> dict[str, Counter]:
    """USER_INPUT / LLM_RESPONSE per session: database plus pending log."""
    out: dict[str, Counter] = {}
    conn = sqlite3.connect(state / "timeline.db")
    rows = conn.execute("SELECT session_id, event_type FROM timeline_events").fetchall()
    conn.close()
    pend = read_pending(str(state / "timeline.db-pending"))
    rows += [(e[1], e[4]) for evs in pend.events.values() for e in evs]
    for sid, etype in rows:
        out.setdefault(sid, Counter())[etype] += 1
    return out


def session_turns(state: Path) -> dict[str, int]:
    conn = sqlite3.connect(state / "agents/main/sessions/sessions.db")
    rows = conn.execute("SELECT session_id, entry FROM sessions").fetchall()
    conn.close()
    return {sid: json.loads(e).get("counters", {}).get("turns", 0) for sid, e in rows}


def disagreements(state: Path) -> list[str]:
    """Where the restored ``state`` is not what one instant of this workload leaves."""
    transcripts = transcript_counts(state / "agents/main/sessions")
    timeline = timeline_counts(state)
    bad = []
    for sid, tl in timeline.items():
        tr = transcripts.get(sid)
        if tr is None:
            if tl["USER_INPUT"]:
                bad.append(f"{sid}: timeline input, no transcript")
            continue
        for role, etype in (("user", "USER_INPUT"), ("assistant", "LLM_RESPONSE")):
            ahead = tr[role] - tl[etype]
            if not 0 <= ahead <= 1:
                bad.append(f"{sid}: transcript {tr[role]} {role} messages, timeline "
                           f"{tl[etype]} {etype}")
    for sid, turns in session_turns(state).items():
        held = transcripts.get(sid, Counter())["user"]
        if turns > held:
            bad.append(f"{sid}: sessions.db counts {turns} turns, transcript holds {held}")
    return bad


async def test_backups_of_a_serving_gateway_are_each_one_instant(tmp_path):
    cfg = base_config(tmp_path / "state")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    async with running_gateway(cfg) as gw:
        await asyncio.gather(*(gw.local.send("hello", to=f"u{s}") for s in range(SESSIONS)))
        old_transcripts(gw.state_dir / "agents/main/sessions")
        stop, served = asyncio.Event(), Counter()

        async def serve(s: int) -> None:
            while not stop.is_set():
                await gw.local.send(f"turn {served[s]} of u{s}", to=f"u{s}")
                served[s] += 1
        flowing = [asyncio.create_task(serve(s)) for s in range(SESSIONS)]
        made = []
        try:
            for n in range(3):
                archive = tmp_path / f"b{n}.tar.gz"
                before, t0 = sum(served.values()), time.perf_counter()
                code = await asyncio.to_thread(cli, ["--config", str(path), "backup",
                                                     "create", "--json", "--to", str(archive)])
                assert code == 0
                made.append((archive, sum(served.values()) - before,
                             time.perf_counter() - t0))
        finally:
            stop.set()
            await asyncio.gather(*flowing)
    for n, (archive, during, took) in enumerate(made):
        assert during > 0, "turns kept flowing while the backup was made"
        checked = verify_archive(archive)
        assert checked.ok, checked.problems
        restored = tmp_path / f"restored{n}"
        assert restore(archive, restored).ok
        assert disagreements(restored) == [], archive.name
    for archive, during, took in made:
        cut = peek_manifest(archive)["cut"]  # made by the gateway, its writers held briefly
        print(f"{archive.name}: {took:.2f} s, {during} turns served meanwhile, writers "
              f"held {cut['hold_ms']} ms")
        assert 0 < cut["hold_ms"] < 2000


async def test_a_parked_timeline_writer_acknowledges_nothing_until_resumed(tmp_path):
    from runtime.timeline import Timeline
    tl = await Timeline.open_sqlite(tmp_path / "timeline.db")
    pending = tmp_path / "timeline.db-pending"
    try:
        await tl.init_timeline("s1", "agent:main:k")
        pause = tl.store.pause_writer()
        await pause.parked
        size = pending.stat().st_size
        appended = asyncio.ensure_future(tl.append_event("s1", "USER_INPUT", {"text": "x"}))
        await asyncio.sleep(0.05)  # the writer thread had time to take it, were it running
        assert not appended.done() and pending.stat().st_size == size
        pause.resume()
        assert (await appended).seq == 2 and pending.stat().st_size > size
    finally:
        await tl.close()
