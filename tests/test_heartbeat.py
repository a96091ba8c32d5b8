"""The heartbeat through the real gateway (issue 4 "How it is proven"): a FakeClock drives
the timer, a fake OpenAI-compatible server answers, a recording channel (or the fake
Telegram, in the daemon smoke test) observes delivery, and the files on disk are checked.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from structlog.testing import capture_logs

from channels.base import InboundMessage
from gateway.config.load import ConfigError, parse_config
from gateway.routing import Route
from runtime.clock import FakeClock, parse_iso
from runtime.context.messages import user_message
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import start_in_thread as telegram_in_thread
from tests.helpers import GatewayProcess, base_config, stored_sessions
from tests.scheduler_harness import (
    MAIN,
    T0,
    beat,
    config,
    gateway,
    sessions_json,
    transcript,
    transcript_path,
    until,
)

PROMPT_START = "Read HEARTBEAT.md if it exists"


@pytest.fixture
async def fake():
    async with FakeOpenAI() as server:
        yield server


def beats(log: list[dict]) -> list[dict]:
    return [e for e in log if e["event"] == "heartbeat"]


# -- timer ---------------------------------------------------------------------------------

async def test_interval_coalescing_and_rearm_from_last_run(tmp_path, fake):
    fake.responder = lambda body: "HEARTBEAT_OK"
    clock = FakeClock(T0)
    async with gateway(config(tmp_path, fake.base_url, heartbeat={"every": "30m"}),
                       clock) as gw:
        runner = gw.scheduling.heartbeat
        await clock.advance(1799)
        assert runner.outcomes == [] and fake.requests == []
        await clock.advance(1)
        await until(lambda: len(runner.outcomes) == 1)
        assert runner.outcomes[0].outcome == "ok" and len(fake.requests) == 1

        # A burst of requests 10 minutes later (spread over 0.2 s) is one beat...
        await clock.advance(600)
        for i in range(5):
            assert runner.request_heartbeat_now("main", f"burst-{i}")
            await clock.advance(0.05)
        await until(lambda: len(runner.outcomes) == 2)
        await clock.settle()
        await asyncio.sleep(0.05)
        assert len(runner.outcomes) == 2 and len(fake.requests) == 2

        # ...and the interval restarts from it: nothing at the old slot (t=3600)...
        await clock.advance(1799 - 0.05 * 5 + 0.25)
        await asyncio.sleep(0.05)
        assert len(runner.outcomes) == 2
        # ...the next beat comes 30 min after the requested one.
        await clock.advance(1)
        await until(lambda: len(runner.outcomes) == 3)
        assert len(fake.requests) == 3
        prompts = [r.json["messages"][-1]["content"] for r in fake.requests]
        assert all(p.startswith(PROMPT_START) for p in prompts)


async def test_every_exit_path_rearms_the_timer(tmp_path, fake):
    """An error beat (model down) and a timed-out beat still leave the timer running."""
    clock = FakeClock(T0)
    hb = {"every": "10m", "timeout": "30s", "target": "testchan:1"}
    async with gateway(config(tmp_path, fake.base_url, heartbeat=hb), clock) as gw:
        runner = gw.scheduling.heartbeat
        fake.script_error(500, message="upstream down")
        await clock.advance(600)
        await until(lambda: len(runner.outcomes) == 1)
        assert runner.outcomes[0].outcome == "error"
        fake.script_hang()
        await clock.advance(600)
        await until(lambda: len(fake.requests) == 2)
        await clock.advance(30)  # the beat's timeout
        await until(lambda: len(runner.outcomes) == 2)
        assert runner.outcomes[1].outcome == "error"
        assert "timed out" in runner.outcomes[1].reason
        fake.script_text("HEARTBEAT_OK")
        await clock.advance(600 - 30)
        await until(lambda: len(runner.outcomes) == 3)
        assert runner.outcomes[2].outcome == "ok"
        assert gw.testchan.sent == []  # errors are not alerts


# -- skip reasons --------------------------------------------------------------------------

async def test_skip_empty_heartbeat_file_and_busy(tmp_path, fake):
    clock = FakeClock(T0)
    cfg = config(tmp_path, fake.base_url, heartbeat={"every": "100h"})
    async with gateway(cfg, clock) as gw:
        ws = gw.config.workspace_for("main")
        (ws / "HEARTBEAT.md").write_text("# Heartbeat tasks\n\n- \n- [ ]\n<!-- none yet -->\n")
        with capture_logs() as logs:
            out = await beat(gw, clock)
        assert (out.outcome, out.reason) == ("skipped", "empty_heartbeat_file")
        assert fake.requests == []
        [line] = beats(logs)
        assert line["outcome"] == "skipped" and line["reason"] == "empty_heartbeat_file"
        assert line["agent"] == "main" and "duration_ms" in line

        (ws / "HEARTBEAT.md").write_text("# Tasks\n- Check the backup log\n")
        fake.script_text("first answer", delay=0.3)
        user = asyncio.ensure_future(gw.local.send("hello", session_key=MAIN))
        await until(lambda: fake.requests)  # the user turn holds the main lane
        with capture_logs() as logs:
            out = await beat(gw, clock)
        assert (out.outcome, out.reason) == ("skipped", "busy")
        assert [(b["outcome"], b["reason"]) for b in beats(logs)] == [("skipped", "busy")]
        assert (await user).text == "first answer"
        # The requested beat is not lost: it is retried once the lane is free.
        fake.script_text("HEARTBEAT_OK")
        runner = gw.scheduling.heartbeat
        await clock.advance(5.0)
        await clock.advance(0.25)
        await until(lambda: runner.outcomes[-1].outcome == "ok")
        assert "Check the backup log" in fake.requests[-1].json["messages"][-1]["content"]


async def test_empty_heartbeat_file_does_not_swallow_a_wake(tmp_path, fake):
    """A beat woken by a system event runs even when HEARTBEAT.md has nothing to do."""
    clock = FakeClock(T0)
    async with gateway(config(tmp_path, fake.base_url, heartbeat={"every": "100h"}),
                       clock) as gw:
        (gw.config.workspace_for("main") / "HEARTBEAT.md").write_text("# Heartbeat\n")
        out = await beat(gw, clock, reason="api")
        assert (out.outcome, out.reason) == ("skipped", "empty_heartbeat_file")
        runner = gw.scheduling.heartbeat
        fake.script_text("HEARTBEAT_OK")
        runner.request_heartbeat_now("main", "api")  # the wake's reason wins the burst
        gw.scheduling.enqueue(MAIN, "Background command abc finished: exit 0", "exec",
                              wake=True)
        await clock.advance(0.25)
        await until(lambda: len(runner.outcomes) == 2)
        assert runner.outcomes[-1].outcome == "ok"
        assert "(exec) \"Background command abc finished" in \
            fake.requests[-1].json["messages"][0]["content"]


@pytest.mark.parametrize("session,key", [(None, MAIN), ("main", MAIN),
                                         ("agent:main:telegram:dm:42",
                                          "agent:main:telegram:dm:42")])
async def test_heartbeat_session_option(tmp_path, fake, session, key):
    fake.responder = lambda body: "HEARTBEAT_OK"
    clock = FakeClock(T0)
    hb = {"every": "100h", **({"session": session} if session else {})}
    async with gateway(config(tmp_path, fake.base_url, heartbeat=hb), clock) as gw:
        assert gw.scheduling.heartbeat.status()["main"]["session_key"] == key
        with capture_logs() as logs:
            await beat(gw, clock)
        assert [b["session_key"] for b in beats(logs)] == [key]
        assert gw.agents["main"].store.get(key) is not None


async def test_skip_quiet_hours_and_disabled(tmp_path, fake):
    clock = FakeClock(T0)  # 00:00 UTC
    hb = {"every": "100h", "active_hours": {"start": "09:00", "end": "17:00",
                                            "timezone": "UTC"}}
    cfg = config(tmp_path, fake.base_url, heartbeat=hb)
    cfg["agents"]["list"] = [{"id": "main"}, {"id": "quiet", "heartbeat": {"every": "0"}}]
    async with gateway(cfg, clock) as gw:
        with capture_logs() as logs:
            out = await beat(gw, clock)
            assert gw.scheduling.heartbeat.request_heartbeat_now("quiet", "test") is False
        assert (out.outcome, out.reason) == ("skipped", "quiet_hours")
        assert ("skipped", "quiet_hours") in [(b["outcome"], b["reason"]) for b in beats(logs)]
        disabled = [e for e in logs if e["event"] == "heartbeat_skipped"]
        assert disabled and disabled[0]["reason"] == "disabled" and \
            disabled[0]["agent"] == "quiet"
        assert fake.requests == []


# -- HEARTBEAT_OK handling -------------------------------------------------------------------

LONG_NOTE = "The nightly backup of db-1 failed with exit code 2. " * 8  # > 300 chars

ACK_CASES = [
    ("bare", "HEARTBEAT_OK", None),
    ("bold", "**HEARTBEAT_OK**", None),
    ("backticks", "`HEARTBEAT_OK`", None),
    ("punctuation", "HEARTBEAT_OK.", None),
    ("short note", "HEARTBEAT_OK - inbox empty, builds green", None),
    ("long note", f"HEARTBEAT_OK {LONG_NOTE}", LONG_NOTE.strip()),
    ("mid-text", "I'd say HEARTBEAT_OK, but the disk is 97% full.",
     "I'd say HEARTBEAT_OK, but the disk is 97% full."),
]


@pytest.mark.parametrize("reply,delivered", [(r, d) for _, r, d in ACK_CASES],
                         ids=[c[0] for c in ACK_CASES])
async def test_heartbeat_ok_variants(tmp_path, fake, reply, delivered):
    clock = FakeClock(T0)
    cfg = config(tmp_path, fake.base_url, heartbeat={"every": "100h", "target": "testchan:42"})
    async with gateway(cfg, clock) as gw:
        fake.script_text("hi there")
        await gw.local.send("hello", session_key=MAIN)
        await clock.advance(60)
        store = gw.agents["main"].store
        await store.flush()
        path = transcript_path(gw)
        before, updated = path.read_bytes(), store.get(MAIN).updated_at
        before_json = sessions_json(gw)[MAIN]

        fake.script_text(reply)
        out = await beat(gw, clock)
        await store.flush()
        if delivered is None:
            assert out.outcome == "ok"
            assert gw.testchan.sent == []
            assert path.read_bytes() == before
            assert store.get(MAIN).updated_at == updated
            assert sessions_json(gw)[MAIN]["updated_at"] == before_json["updated_at"]
        else:
            assert out.outcome == "delivered"
            assert [(m.to, m.text, m.kind) for m in gw.testchan.sent] == \
                [("42", delivered, "heartbeat")]
            rows = transcript(gw)[len(before.splitlines()):]
            assert [r["message"]["role"] for r in rows] == ["user", "assistant"]
            assert rows[0]["message"]["content"][0]["text"].startswith(PROMPT_START)
            assert rows[1]["message"]["content"][0]["text"] == reply
            assert store.get(MAIN).updated_at > updated
        # The next turn's context never contains an ack-only beat.
        fake.script_text("ok")
        await gw.local.send("what's new?", session_key=MAIN)
        history = json.dumps(fake.requests[-1].json["messages"][1:])
        assert (PROMPT_START in history) is (delivered is not None)


async def test_ack_beat_is_byte_identical_while_another_writer_appends(tmp_path, fake):
    clock = FakeClock(T0)
    async with gateway(config(tmp_path, fake.base_url, heartbeat={"every": "100h"}),
                       clock) as gw:
        fake.script_text("hi there")
        await gw.local.send("hello", session_key=MAIN)
        await clock.advance(60)
        store = gw.agents["main"].store
        await store.flush()
        entry = store.get(MAIN)
        path = transcript_path(gw)
        before, updated = path.read_bytes(), entry.updated_at
        disk_updated = sessions_json(gw)[MAIN]["updated_at"]

        # The beat's model call takes a while; another writer appends to the same
        # transcript (through the session's own log) while it is in flight.
        fake.script_text("**HEARTBEAT_OK**", delay=0.3)
        runner = gw.scheduling.heartbeat
        assert runner.request_heartbeat_now("main", "test")
        await clock.advance(0.25)
        await until(lambda: len(fake.requests) == 2)
        slog = gw.logs.get("main", entry.session_id, MAIN)
        other = slog.append_message(user_message("note from another writer",
                                                 int(clock.time() * 1000)))
        during = path.read_bytes()
        assert during.startswith(before) and len(during.splitlines()) == \
            len(before.splitlines()) + 1
        await until(lambda: runner.outcomes, what="the beat")
        assert runner.outcomes[-1].outcome == "ok"

        await store.flush()
        assert path.read_bytes() == during  # exactly what it would be without the beat
        assert store.get(MAIN).updated_at == updated
        assert sessions_json(gw)[MAIN]["updated_at"] == disk_updated
        # The chain continues from the other writer's line, not from a dropped beat line.
        fake.script_text("sure")
        await gw.local.send("next", session_key=MAIN)
        rows = transcript(gw)
        assert rows[len(during.splitlines())]["parentId"] == other["id"]
        assert all(r["id"] for r in rows[1:])
        # The timeline still records the beat.
        await gw.timeline_hooks.flush()
        events = await gw.timeline_hooks.timeline.get_timeline(entry.session_id)
        hb = [e.content for e in events if e.event_type == "HEARTBEAT"]
        assert hb and hb[-1]["outcome"] == "ok"


# -- delivery ------------------------------------------------------------------------------

async def test_alert_text_is_not_delivered_twice_within_24h(tmp_path, fake):
    clock = FakeClock(T0)
    cfg = config(tmp_path, fake.base_url, heartbeat={"every": "100h", "target": "testchan:7"})
    async with gateway(cfg, clock) as gw:
        alert = "Backup failed on db-1."
        fake.script_text(alert)
        assert (await beat(gw, clock)).outcome == "delivered"
        await clock.advance(3600)
        fake.script_text(f"  {alert}\n")  # same text up to whitespace
        out = await beat(gw, clock)
        assert (out.outcome, out.reason) == ("duplicate", "same_text_within_24h")
        fake.script_text("Backup failed on db-2.")
        assert (await beat(gw, clock)).outcome == "delivered"
        await clock.advance(86400 - 3600)  # 24 h after the first delivery
        fake.script_text(alert)
        assert (await beat(gw, clock)).outcome == "delivered"
        assert gw.testchan.texts() == [alert, "Backup failed on db-2.", alert]


async def test_alert_ledger_is_on_disk_and_survives_a_restart(tmp_path, fake):
    """The 24 h de-dup holds across a gateway restart: the ledger is written to
    ``heartbeat/delivered.json`` from the first alert (an empty ledger is falsy and was once
    swapped for a memory-only one, so the file never appeared and alerts repeated)."""
    clock = FakeClock(T0)
    cfg = config(tmp_path, fake.base_url, heartbeat={"every": "100h", "target": "testchan:7"})
    alert = "Disk /var is 97% full."
    ledger = tmp_path / "state" / "heartbeat" / "delivered.json"
    async with gateway(cfg, clock) as gw:
        assert gw.state_dir / "heartbeat" / "delivered.json" == ledger
        fake.script_text(alert)
        assert (await beat(gw, clock)).outcome == "delivered"
        assert gw.testchan.texts() == [alert]
    rows = json.loads(ledger.read_text())
    assert [(a, ts) for a, _digest, ts in rows] == [("main", T0 + 0.25)]  # after the wake window
    assert alert not in ledger.read_text()  # only a digest is kept
    clock = FakeClock(T0 + 6 * 3600)  # restarted 6 h later
    async with gateway(cfg, clock) as gw:
        fake.script_text(alert)
        out = await beat(gw, clock)
        assert (out.outcome, out.reason) == ("duplicate", "same_text_within_24h")
        assert gw.testchan.texts() == []


async def test_delivery_to_last_route_never_changes_it(tmp_path, fake):
    clock = FakeClock(T0)
    cfg = config(tmp_path, fake.base_url, heartbeat={"every": "100h", "target": "last"},
                 session={"dm_scope": "main"})
    async with gateway(cfg, clock) as gw:
        fake.script_text("hello Ann")
        await gw.intake.on_message(InboundMessage(channel="testchan", text="hi",
                                                  sender_id="42", sender_name="Ann",
                                                  received_at=clock.time()))
        await until(lambda: gw.testchan.sent, what="the reply")
        store = gw.agents["main"].store
        route = dict(store.get(MAIN).last_route)
        assert Route.from_dict(route) == Route("testchan", "42")

        fake.script_text("Your 10:00 meeting moved to 11:00.")
        out = await beat(gw, clock)
        assert out.outcome == "delivered"
        sent = gw.testchan.sent[-1]
        assert (sent.channel, sent.to, sent.kind) == ("testchan", "42", "heartbeat")
        assert sent.text == "Your 10:00 meeting moved to 11:00."
        await store.flush()
        assert store.get(MAIN).last_route == route
        on_disk = sessions_json(gw)
        assert on_disk[MAIN]["last_route"] == route
        assert list(on_disk) == [MAIN]  # delivering created no session
        assert '"last"' not in json.dumps(on_disk)  # the placeholder is never a recipient


async def test_explicit_target_delivery_keeps_the_sessions_last_route(tmp_path, fake):
    clock = FakeClock(T0)
    cfg = config(tmp_path, fake.base_url, session={"dm_scope": "main"},
                 heartbeat={"every": "100h", "target": "testchan:ops-room"})
    async with gateway(cfg, clock) as gw:
        fake.script_text("hello")
        await gw.intake.on_message(InboundMessage(channel="testchan", text="hi",
                                                  sender_id="42", received_at=clock.time()))
        await until(lambda: gw.testchan.sent)
        fake.script_text("Deploy finished with 2 warnings.")
        assert (await beat(gw, clock)).outcome == "delivered"
        assert gw.testchan.sent[-1].to == "ops-room"
        await gw.agents["main"].store.flush()
        assert sessions_json(gw)[MAIN]["last_route"]["to"] == "42"


async def test_target_last_without_a_route_logs_and_sends_nothing(tmp_path, fake):
    clock = FakeClock(T0)
    cfg = config(tmp_path, fake.base_url, heartbeat={"every": "100h", "target": "last"})
    async with gateway(cfg, clock) as gw:
        fake.script_text("Something needs your attention.")
        with capture_logs() as logs:
            out = await beat(gw, clock)
        assert (out.outcome, out.reason) == ("alert", "no_last_route")
        assert gw.testchan.sent == []
        assert any(e["event"] == "heartbeat_no_route" and e["session_key"] == MAIN
                   for e in logs)
        assert [b["outcome"] for b in beats(logs)] == ["alert"]


def test_unusable_heartbeat_settings_are_config_errors(tmp_path, fake):
    hb = {"every": "10m", "target": "telegram", "session": "ops-room",
          "active_hours": {"start": "00:00", "end": "23:00", "timezone": "Mars/Base"}}
    with pytest.raises(ConfigError) as exc:
        parse_config(config(tmp_path, fake.base_url, heartbeat=hb), "test", env={})
    assert [p.split(":")[0] for p in exc.value.problems] == [
        "agents.defaults.heartbeat.target", "agents.defaults.heartbeat.session",
        "agents.defaults.heartbeat.active_hours.timezone"]


# -- active hours --------------------------------------------------------------------------

@pytest.mark.parametrize("window", [
    {"start": "22:00", "end": "06:00", "timezone": "America/New_York"},
    {"start": "22:00", "end": "06:00", "timezone": "user"},
])
async def test_active_hours_across_midnight_in_a_non_utc_zone(tmp_path, fake, window):
    fake.responder = lambda body: "HEARTBEAT_OK"
    clock = FakeClock(parse_iso("2026-01-01T02:00:00Z"))  # 21:00 in New York (EST)
    cfg = config(tmp_path, fake.base_url, tz="America/New_York",
                 heartbeat={"every": "100h", "active_hours": window})
    async with gateway(cfg, clock) as gw:
        seen = []
        for hours in (0, 1.5, 5, 3.75, 0.5):  # 21:00 22:30 03:30 07:15 07:45 local
            await clock.advance(hours * 3600)
            seen.append((await beat(gw, clock)).reason or "ran")
        assert seen == ["quiet_hours", "ran", "ran", "quiet_hours", "quiet_hours"]
        assert len(fake.requests) == 2


# -- the daemon, in real time -----------------------------------------------------------------

def test_daemon_smoke_heartbeat_every_2s(tmp_path):
    """The real daemon: heartbeat every 2 s; the model acks, then alerts. The ack beat leaves
    no trace on disk; the alert is in the transcript and reaches the fake Telegram once."""
    model = FakeOpenAI.start_in_thread()
    tg = telegram_in_thread()
    try:
        model.server.script_text("HEARTBEAT_OK")
        model.server.script_text("ALERT: the disk of db-1 is 97% full")
        model.server.responder = lambda body: "HEARTBEAT_OK"
        cfg = base_config(tmp_path / "state", model.base_url)
        cfg["agents"]["defaults"]["heartbeat"] = {"every": "2s", "target": "telegram:4242"}
        cfg["channels"] = {"telegram": {"enabled": True, "token": tg.fake.token,
                                        "api_base_url": f"{tg.url}/bot", "dm_policy": "open",
                                        "poll_timeout": 1}}
        gp = GatewayProcess(tmp_path, cfg).start()
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not tg.call(tg.fake.bot_messages, 4242):
                time.sleep(0.05)
            time.sleep(0.3)
        finally:
            assert gp.stop() == 0
        sent = tg.call(tg.fake.bot_messages, 4242)
        assert [m["text"] for m in sent] == ["ALERT: the disk of db-1 is 97% full"]
        sessions = stored_sessions(gp.state_dir)
        sid = sessions[MAIN]["session_id"]
        rows = [json.loads(x) for x in (gp.state_dir / "agents/main/sessions" /
                                        f"{sid}.jsonl").read_text().splitlines()]
        messages = [r["message"] for r in rows[1:]]
        texts = [(m["role"], m["content"][0]["text"]) for m in messages]
        assert [t for t in texts if t[0] == "assistant"] == \
            [("assistant", "ALERT: the disk of db-1 is 97% full")]
        assert len([t for t in texts if t[0] == "user"]) == 1
        assert sessions[MAIN]["last_route"] is None
        outcomes = [(r.get("outcome"), r.get("reason")) for r in gp.log_lines()
                    if r.get("event") == "heartbeat"]
        assert outcomes[:2] == [("ok", None), ("delivered", None)]
    finally:
        tg.stop()
        model.stop()
