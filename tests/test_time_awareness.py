"""Time awareness (issue 5, seed 002), through the real gateway on a FakeClock:

- the "Time Awareness" section the model receives as its system message;
- memory_search as a real tool: time windows (in the user's timezone) and decay ranking;
- skills carry created_at / updated_at / last_used_at without disturbing the prompt;
- old files without times (sessions.json, transcripts, cron jobs.json, skills index) load.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from runtime.clock import FakeClock, utc_iso
from runtime.skills import load_skills
from runtime.transcript import read_tail
from scheduler.cron.store import CronStore
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway, stored_sessions

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, a Thursday
CHAT = "/v1/chat/completions"


def chat_requests(fake: FakeOpenAI) -> list[dict]:
    return [r.json for r in fake.requests if r.path == CHAT]


def system_of(body: dict) -> str:
    assert body["messages"][0]["role"] == "system"
    return body["messages"][0]["content"]


def time_section(system: str) -> str:
    start = system.index("# Time Awareness")
    return system[start:system.index("\n\n# Environment", start)]


def config(state: Path, fake: FakeOpenAI, tz: str = "UTC", **sections) -> dict:
    return base_config(state, fake.base_url,
                       agents={"defaults": {"model": "fake/fake-model", "user_timezone": tz}},
                       **sections)


# ---- the Time Awareness section ------------------------------------------------------------


async def test_time_awareness_section_for_given_clocks(tmp_path):
    clock = FakeClock(T0)
    older = "Older information may be less relevant than recent information; prefer recent " \
            "facts when they conflict."
    async with FakeOpenAI() as fake:
        async with running_gateway(config(tmp_path / "state", fake, "Asia/Tokyo"),
                                   clock=clock) as gw:
            await gw.local.send("first")
            for step in (45, 140, 7022):  # elapsed 45s, 3m 5s, 2h 0m 7s
                await clock.advance(step)
                await gw.local.send("again")
        systems = [system_of(b) for b in chat_requests(fake)]

    assert [time_section(s) for s in systems] == [
        "# Time Awareness\n"
        "Current time: 2026-01-01 09:00:00 JST (Thursday) — timezone Asia/Tokyo.\n"
        "Session started: 2026-01-01 09:00:00 JST (Thursday); elapsed 0s.\n" + older,
        "# Time Awareness\n"
        "Current time: 2026-01-01 09:00:45 JST (Thursday) — timezone Asia/Tokyo.\n"
        "Session started: 2026-01-01 09:00:00 JST (Thursday); elapsed 45s.\n"
        "The user last wrote 45s ago.\n" + older,
        "# Time Awareness\n"
        "Current time: 2026-01-01 09:03:05 JST (Thursday) — timezone Asia/Tokyo.\n"
        "Session started: 2026-01-01 09:00:00 JST (Thursday); elapsed 3m 5s.\n"
        "The user last wrote 2m 20s ago.\n" + older,
        "# Time Awareness\n"
        "Current time: 2026-01-01 11:00:07 JST (Thursday) — timezone Asia/Tokyo.\n"
        "Session started: 2026-01-01 09:00:00 JST (Thursday); elapsed 2h 0m 7s.\n"
        "The user last wrote 1h 57m 2s ago.\n" + older,
    ]
    # after the identity, before the environment; the prefix before it never changes
    for s in systems:
        assert s.index("# Identity") < s.index("# Time Awareness") < s.index("# Environment")
    prefixes = {s[:s.index("# Time Awareness")] for s in systems}
    assert len(prefixes) == 1


# ---- memory_search through the gateway -----------------------------------------------------

MEMORY_MD = """# Deploys

Deploy the gateway with a blue green switch. <!-- ts: 2026-01-01T02:00:00Z -->

Deploy the gateway with a blue green switch. <!-- ts: 2026-01-01T00:00:00Z -->

Late night note: deploy freeze until the morning. <!-- ts: 2025-12-31T14:00:00Z -->

Unrelated: buy milk. <!-- ts: 2026-01-01T02:30:00Z -->
"""


@pytest.mark.parametrize("lam", [0.0, 0.5])
async def test_memory_search_tool_time_windows_and_decay(tmp_path, lam):
    state = tmp_path / "state"
    ws = state / "workspace" / "main"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text(MEMORY_MD)
    # a daily note in the user's timezone: 01:30 JST on Jan 1 is 16:30Z on Dec 31
    (ws / "memory" / "2026-01-01.md").write_text("[01:30] deploy checklist reviewed\n")
    clock = FakeClock(T0 + 3 * 3600)  # 2026-01-01T03:00:00Z, 12:00 JST
    async with FakeOpenAI() as fake:
        cfg = config(state, fake, "Asia/Tokyo", memory={"time_decay_lambda": lam})
        async with running_gateway(cfg, clock=clock) as gw:
            fake.script_tool_calls([
                {"id": "m1", "name": "memory_search",
                 "arguments": {"query": "deploy", "created_after": "2026-01-01"}},
                {"id": "m2", "name": "memory_search",
                 "arguments": {"query": "deploy", "created_before": "2026-01-01T00:00:00Z"}},
                {"id": "m3", "name": "memory_search",
                 "arguments": {"query": "deploy", "created_after": "tomorrow"}}])
            fake.script_text("ok")
            result = await gw.local.send("what do we know about deploys?")
            assert result.status == "ok"
        bodies = chat_requests(fake)
    assert "memory_search" in [t["function"]["name"] for t in bodies[0]["tools"]]
    tool_msgs = {m["tool_call_id"]: m["content"] for m in bodies[1]["messages"]
                 if m["role"] == "tool"}

    after = json.loads(tool_msgs["m1"])["results"]
    # the window is the user's Jan 1 (from 15:00Z on Dec 31): the 14:00Z note is out
    assert sorted(r["created_at"] for r in after) == [
        "2025-12-31T16:30:00.000Z", "2026-01-01T00:00:00.000Z", "2026-01-01T02:00:00.000Z"]
    assert all("milk" not in r["text"] for r in after)
    twins = [r for r in after if r["path"] == "MEMORY.md"]
    assert [r["created_at"] for r in twins] == ["2026-01-01T02:00:00.000Z",
                                                "2026-01-01T00:00:00.000Z"]
    # same text, so the same relevance: the scores differ by the decay of 1 h vs 3 h only
    # (bounds allow for the 4-decimal rounding of the scores)
    hi, lo = twins[0]["score"], twins[1]["score"]
    assert (hi - 5e-5) / (lo + 5e-5) <= math.exp(lam * 2) <= (hi + 5e-5) / (lo - 5e-5)

    before = json.loads(tool_msgs["m2"])["results"]
    assert sorted(r["created_at"] for r in before) == ["2025-12-31T14:00:00.000Z",
                                                       "2025-12-31T16:30:00.000Z"]
    daily = next(r for r in before if r["path"] == "memory/2026-01-01.md")
    assert daily["line"] == 1 and "checklist" in daily["text"]

    assert tool_msgs["m3"] == ("error: memory_search: created_after 'tomorrow' is not "
                               "RFC 3339 or YYYY-MM-DD")


# ---- skills ------------------------------------------------------------------------------

SKILL = "---\nname: weather\ndescription: {desc}\n---\n# Weather\nCall the forecast API.\n"


async def test_skills_timestamps_and_byte_stable_prompt(tmp_path):
    state = tmp_path / "state"
    md = state / "workspace" / "main" / "skills" / "weather" / "SKILL.md"
    md.parent.mkdir(parents=True)
    md.write_text(SKILL.format(desc="Forecasts for a city"))
    os.utime(md, (T0 - 86400, T0 - 86400))
    index = md.parent.parent / ".index.json"
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        async with running_gateway(config(state, fake), clock=clock) as gw:
            fake.script_tool_call("read", {"path": "skills/weather/SKILL.md"}, call_id="r1")
            fake.script_text("It will rain.")
            await gw.local.send("weather?")
            first = json.loads(index.read_text())["skills"]["weather"]
            assert (first["name"], first["description"]) == ("weather", "Forecasts for a city")
            assert first["created_at"] == first["updated_at"] == "2025-12-31T00:00:00.000Z"
            assert first["last_used_at"] == "2026-01-01T00:00:00.000Z"

            await clock.advance(3600)
            await gw.local.send("thanks")
            assert gw.agents["main"].prompt.rebuilds == 1  # using a skill is not a change

            md.write_text(SKILL.format(desc="Forecasts and rain alerts"))
            os.utime(md, (T0 + 3000, T0 + 3000))
            await clock.advance(60)
            await gw.local.send("and tomorrow?")
            last = json.loads(index.read_text())["skills"]["weather"]
        systems = [system_of(b) for b in chat_requests(fake)]

    line = "- weather: Forecasts for a city (skills/weather/SKILL.md)"
    assert line in systems[0]
    prefix = [s[:s.index("# Time Awareness")] for s in systems]
    assert prefix[0] == prefix[1] == prefix[2]  # before and after the read
    assert "last_used" not in systems[0] and "2026-01-01T00:00" not in prefix[0]
    assert "- weather: Forecasts and rain alerts (skills/weather/SKILL.md)" in prefix[3]
    assert last["created_at"] == "2025-12-31T00:00:00.000Z"
    assert last["updated_at"] == "2026-01-01T00:50:00.000Z"
    assert last["last_used_at"] == "2026-01-01T00:00:00.000Z"


def test_old_or_broken_skills_index_loads_with_times_filled(tmp_path):
    root = tmp_path / "skills"
    for name in ("alpha", "beta"):
        (root / name).mkdir(parents=True)
        (root / name / "SKILL.md").write_text(f"# {name}\nno frontmatter\n")
        os.utime(root / name / "SKILL.md", (T0, T0))
    index = root / ".index.json"
    # an older index: no version, no times, a bad time, a skill that no longer exists
    index.write_text(json.dumps({"skills": {
        "alpha": {"name": "alpha", "description": ""},
        "beta": {"name": "beta", "description": "", "last_used_at": "yesterday"},
        "gone": {"name": "gone"}}}))
    skills = load_skills(tmp_path, now=T0 + 60)
    assert [(s.dir, s.name, s.created_at, s.updated_at, s.last_used_at) for s in skills] == [
        ("alpha", "alpha", T0, T0, None), ("beta", "beta", T0, T0, None)]
    stored = json.loads(index.read_text())
    assert stored["version"] == 1 and set(stored["skills"]) == {"alpha", "beta"}
    assert stored["skills"]["alpha"]["created_at"] == utc_iso(T0)

    index.write_text("{not json")
    assert [s.dir for s in load_skills(tmp_path, now=T0)] == ["alpha", "beta"]
    assert json.loads(index.read_text())["version"] == 1
    before = index.stat().st_mtime_ns
    load_skills(tmp_path, now=T0)  # nothing changed: not rewritten
    assert index.stat().st_mtime_ns == before


# ---- old files without times ---------------------------------------------------------------


async def test_old_sessions_and_transcript_without_times_load_and_continue(tmp_path, capsys):
    state = tmp_path / "state"
    sessions = state / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    key = "agent:main:cli:dm:local"
    # OpenClaw's flat form, camelCase, epoch ms, no createdAt / lastActiveAt
    (sessions / "sessions.json").write_text(json.dumps(
        {key: {"sessionId": "old-1", "updatedAt": 1_767_139_200_000}}))
    transcript = sessions / "old-1.jsonl"
    transcript.write_text(
        '{"type":"session","version":3,"id":"old-1"}\n'
        '{"type":"message","id":"a1","parentId":null,"message":{"role":"user",'
        '"content":[{"type":"text","text":"my name is Ada"}]}}\n'
        '{"type":"message","id":"a2","parentId":"a1","message":{"role":"assistant",'
        '"content":[{"type":"text","text":"Hi Ada"}]}}\n')
    os.utime(transcript, (T0 - 3600, T0 - 3600))
    tail = read_tail(transcript)
    assert [e["timestamp"] for e in tail.entries] == ["2025-12-31T23:00:00.000Z"] * 2
    assert tail.entries[0]["message"]["timestamp"] == int((T0 - 3600) * 1000)
    assert tail.header["timestamp"] == "2025-12-31T23:00:00.000Z"

    async with FakeOpenAI() as fake:
        cfg = config(state, fake)
        async with running_gateway(cfg, clock=FakeClock(T0)) as gw:
            fake.script_text("You are Ada.")
            r = await gw.local.send("what is my name?")
            assert (r.session_id, r.text) == ("old-1", "You are Ada.")
        body = chat_requests(fake)[0]
    assert [m["content"] for m in body["messages"][1:]] == ["my name is Ada", "Hi Ada",
                                                            "what is my name?"]
    assert "Session started: 2025-12-31 00:00:00 UTC (Wednesday); elapsed 24h 0m 0s." \
        in system_of(body)
    assert "The user last wrote 24h 0m 0s ago." in system_of(body)
    migrated = (sessions / "sessions.json.migrated").exists()  # moved aside, kept
    assert migrated and not (sessions / "sessions.json").exists()
    stored = stored_sessions(state)[key]
    assert stored["created_at"] == "2025-12-31T00:00:00.000Z"
    assert stored["last_active_at"] == "2026-01-01T00:00:00.000Z"

    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    code = await asyncio.to_thread(main, ["--config", str(cfg_path), "sessions", "show", key])
    out = capsys.readouterr().out
    # the old lines take the time of the first line that has one (times never decrease)
    assert code == 0 and "  2026-01-01T00:00:00.000Z user: my name is Ada" in out
    # the timeline opened for the old session on its first event, under its real key
    code = await asyncio.to_thread(main, ["--config", str(cfg_path), "timeline", "show", key,
                                          "--json"])
    shown = json.loads(capsys.readouterr().out)
    assert code == 0 and shown["session_id"] == "old-1" and shown["session_key"] == key
    assert [e["event_type"] for e in shown["events"]] == ["SESSION_CREATE", "USER_INPUT",
                                                          "LLM_RESPONSE", "OUTCOME"]


def test_old_cron_jobs_without_times_load_with_file_mtime(tmp_path):
    path = tmp_path / "cron" / "jobs.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"jobs": [
        {"id": "j1", "name": "digest", "schedule": {"kind": "every", "interval": 600},
         "payload": {"message": "send the digest"}}]}))
    os.utime(path, (T0, T0))
    store = CronStore(path)
    (job,) = store.load()
    assert (job.created_at, job.updated_at) == (T0, T0)
    store.save([job])
    (again,) = CronStore(path).load()
    assert again.created_at == T0
    assert json.loads(path.read_text())["jobs"][0]["created_at"] == "2026-01-01T00:00:00.000Z"
