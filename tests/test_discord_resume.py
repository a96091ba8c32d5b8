"""A Discord gateway session outlives the process that ran it (channels/discord/resume.py):
after a kill -9 the next start (embedded storage: the resume file) or the replica that
takes the account over (issue 15 "Channel accounts": Discord resume state lives in
PostgreSQL, so the takeover loses no update and redelivers none) RESUMEs it and Discord
replays what nobody received; a refused RESUME falls back to IDENTIFY + REST catch-up.
Real ``tidegate gateway`` subprocesses (on a real PostgreSQL for replicas), the real
discord.py client against the fake Discord gateway (which keeps each session's
dispatches and replays those after the RESUME's ``seq``), the fake model."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections import Counter

import pytest

from tests import cluster_harness
from tests.cluster_harness import database_of, wait
from tests.fakes import fake_discord
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import GatewayProcess, base_config
from tests.test_cluster_replicas import TTL, owners, stop_all

pytestmark = pytest.mark.timeout(240)

pg, dsn = cluster_harness.pg, cluster_harness.dsn  # fixtures
ACCOUNT = "discord:default"
RESUME_ROW = "discord:default:resume"


@pytest.fixture
def model():
    m = FakeOpenAI.start_in_thread()
    yield m
    m.stop()


@pytest.fixture
def dc():
    handle = fake_discord.start_in_thread()
    yield handle
    handle.stop()


def call(dc, fn, *args):
    """Run ``fn(*args)`` (a coroutine function of the fake) on the fake's loop."""
    return asyncio.run_coroutine_threadsafe(fn(*args), dc.loop).result(10)


def discord_replicas(tmp, names, dsn, model, dc) -> dict[str, GatewayProcess]:
    section = {"enabled": True, "token": dc.fake.token, "api_base_url": dc.api_url,
               "gateway_url": dc.gateway_url, "dm_policy": "open", "streaming": "off"}
    procs = {}
    for n in names:
        (tmp / n).mkdir(parents=True, exist_ok=True)
        cfg = base_config(tmp / n / "state", model.base_url,
                          channels={"discord": section},
                          storage={"backend": "postgres", "dsn": dsn},
                          cluster={"lease_ttl": f"{TTL}s", "replica_id": n})
        cfg["cron"] = {"enabled": False}
        procs[n] = GatewayProcess(tmp / n, cfg).start(timeout=40)
    return procs


def _plain(echo: str) -> str:
    """The fake model's echo without the sender line a guild message carries in the user
    role (``[from "name" (discord:id)]``): these tests count answers, not who asked."""
    return re.sub(r'^echo: \[from "[^"]*" \([^)]*\)\]\n', "echo: ", echo)


def replies(dc) -> Counter:
    return Counter(_plain(s["payload"]["content"]) for s in dc.fake.sent_messages())


def stored(pg, dsn) -> tuple[dict, str] | None:
    row = pg.psql(f"SELECT value::text || '|' || written_by FROM cluster_channel_state "
                  f"WHERE name = '{RESUME_ROW}'", database_of(dsn)).strip()
    if not row:
        return None
    value, writer = row.rsplit("|", 1)
    return json.loads(value), writer


def session_seq(dc) -> dict[str, int]:
    return {s.id: s.seq for s in list(dc.fake._sessions.values())}


def settled(pg, dsn, dc, owner):
    """The owner's stored position has caught up with everything the fake sent it."""
    got = stored(pg, dsn)
    if got is None or got[1] != owner:
        return None
    value, _ = got
    return value if session_seq(dc).get(value.get("session_id")) == value.get("seq") \
        else None


def history_reads(dc) -> int:
    return sum(1 for s in dc.fake.sent if s["method"] == "GET"
               and s["path"].startswith("/channels/") and s["path"].endswith("/messages"))


def events(gp, name) -> list[dict]:
    try:
        return [x for x in gp.log_lines() if x.get("event") == name]
    except ValueError:  # a line being written
        return []


def single_gateway(tmp, model, dc) -> GatewayProcess:
    section = {"enabled": True, "token": dc.fake.token, "api_base_url": dc.api_url,
               "gateway_url": dc.gateway_url, "dm_policy": "open", "streaming": "off",
               "group_policy": "allowlist", "groups": [dc.fake.channel_id]}
    cfg = base_config(tmp / "state", model.base_url, channels={"discord": section})
    cfg["cron"] = {"enabled": False}
    return GatewayProcess(tmp, cfg)


def _crash_with_missed_messages(tmp_path, model, dc, *, third_in_guild: bool
                                ) -> tuple[GatewayProcess, dict]:
    """A gateway answers one DM, is killed -9, two messages arrive while it is down (the
    third a guild mention: after a RESUME in a fresh process no guild is cached)."""
    gp = single_gateway(tmp_path, model, dc).start(timeout=40)
    resume_file = tmp_path / "state" / "channels" / "discord-default-resume.json"

    def position():
        try:
            value = json.loads(resume_file.read_text())
        except (OSError, ValueError):
            return None
        return value if session_seq(dc).get(value.get("session_id")) == value["seq"] \
            else None
    try:
        wait(lambda: dc.fake.connected == 1, timeout=30, what="the gateway connection")
        call(dc, dc.fake.send_dm, "first message")
        wait(lambda: replies(dc)["echo: first message"] == 1, timeout=30, what="a reply")
        stored_position = wait(position, timeout=20, what="the resume file")
    finally:
        gp.kill9()
    wait(lambda: dc.fake.connected == 0, timeout=10, what="the connection gone")
    call(dc, dc.fake.send_dm, "second message")
    if third_in_guild:
        call(dc, lambda: dc.fake.send_guild("third message", mention=True))
    else:
        call(dc, dc.fake.send_dm, "third message")
    return gp, stored_position


def _answered_once(dc, *names: str) -> None:
    wait(lambda: replies(dc)[f"echo: {names[-1]} message"] >= 1, timeout=30,
         what="the missed messages answered")
    time.sleep(1.0)  # a message answered twice would show now
    assert replies(dc) == Counter({f"echo: {n} message": 1 for n in names})


def test_a_restart_after_kill9_resumes_the_session_from_the_resume_file(tmp_path, model,
                                                                         dc):
    gp, position = _crash_with_missed_messages(tmp_path, model, dc, third_in_guild=True)
    reads = history_reads(dc)
    gp.start(timeout=40)
    try:
        _answered_once(dc, "first", "second", "third")
        # the guild message was answered in its channel, in the channel's session
        [guild] = [p["payload"]["content"] for p in dc.fake.sent_messages(dc.fake.channel_id)]
        assert guild.startswith('echo: [from "Alice A." (discord:')  # the sender, named
        assert _plain(guild) == "echo: third message"
        assert [r for r in dc.fake.resumes if r["accepted"]] == [
            {"session_id": position["session_id"], "seq": position["seq"],
             "path": "/resume-gateway", "accepted": True, "replayed": 2}]
        assert dc.fake.identify_count == 1 and history_reads(dc) == reads
    finally:
        assert gp.stop() == 0


def test_a_refused_resume_identifies_afresh_and_catches_up_over_rest(tmp_path, model, dc):
    # (only DMs: the catch-up reads channels it has a cursor for)
    gp, position = _crash_with_missed_messages(tmp_path, model, dc, third_in_guild=False)
    dc.loop.call_soon_threadsafe(dc.fake.expire_sessions)  # Discord timed the session out
    reads = history_reads(dc)
    gp.start(timeout=40)
    try:
        _answered_once(dc, "first", "second", "third")
        assert [(r["session_id"], r["accepted"]) for r in dc.fake.resumes] == [
            (position["session_id"], False)]  # op 9 Invalid Session
        assert dc.fake.identify_count == 2  # a fresh IDENTIFY after it
        assert history_reads(dc) > reads  # and the REST catch-up found the two
        assert events(gp, "discord_session_invalidated")
    finally:
        assert gp.stop() == 0


def _answered_and_stored(procs, pg, dsn, dc, text: str) -> tuple[str, str, dict]:
    """(owner, the other replica, the stored position) once the owner answered ``text``
    and stored its position."""
    owner = wait(lambda: owners(procs["r1"]).get(ACCOUNT), timeout=30, what="an owner")
    other = next(n for n in procs if n != owner)
    wait(lambda: dc.fake.connected == 1, timeout=30, what="the gateway connection")
    call(dc, dc.fake.send_dm, text)
    wait(lambda: replies(dc)[f"echo: {text}"] == 1, timeout=30, what="a reply")
    position = wait(lambda: settled(pg, dsn, dc, owner), timeout=20,
                    what="the resume state stored")
    return owner, other, position


def test_kill9_of_the_discord_owner_resumes_its_session_on_the_new_owner(tmp_path, pg, dsn,
                                                                          model, dc):
    procs = discord_replicas(tmp_path, ["r1", "r2"], dsn, model, dc)
    try:
        owner, other, position = _answered_and_stored(procs, pg, dsn, dc, "first message")
        assert dc.fake.identify_count == 1
        procs[owner].kill9()
        killed_at = time.monotonic()
        wait(lambda: dc.fake.connected == 0, timeout=10, what="the connection gone")
        # nobody is connected: Discord keeps these in the session for a RESUME
        for text in ("second message", "third message"):
            call(dc, dc.fake.send_dm, text)
        reads = history_reads(dc)
        wait(lambda: owners(procs[other]).get(ACCOUNT) == other, timeout=30,
             what="takeover")
        wait(lambda: replies(dc)["echo: third message"] >= 1, timeout=30,
             what="the missed messages answered")
        took = time.monotonic() - killed_at
        assert took < 4 * TTL + 5, f"takeover + replay took {took:.1f} s"
        print(f"discord takeover after kill -9: missed messages answered in {took:.1f} s "
              f"(lease_ttl {TTL} s)")
        call(dc, dc.fake.send_dm, "fourth message")
        wait(lambda: replies(dc)["echo: fourth message"] >= 1, timeout=30,
             what="a live message after the resume")
        time.sleep(1.5)  # a replayed message answered twice would show now
        assert replies(dc) == Counter({f"echo: {n} message": 1 for n in
                                       ("first", "second", "third", "fourth")})
        # the new owner sent RESUME with the stored session id and sequence number, on
        # READY's resume_gateway_url; no new IDENTIFY, no REST catch-up
        accepted = [r for r in dc.fake.resumes if r["accepted"]]
        assert accepted == [{"session_id": position["session_id"], "seq": position["seq"],
                             "path": "/resume-gateway", "accepted": True,
                             "replayed": 2}]
        assert dc.fake.identify_count == 1
        assert history_reads(dc) == reads
        assert events(procs[other], "discord_connected")[-1]["resumed"] is True
        # and the new owner keeps the position up to date, under its own name
        wait(lambda: settled(pg, dsn, dc, other), timeout=20, what="the new owner's position")
    finally:
        stop_all(procs)


def test_a_clean_handover_resumes_the_session_too(tmp_path, pg, dsn, model, dc):
    """A rolling restart (SIGTERM of the owner): its connection is closed resumable (4000,
    not 1000), so the replica that takes the account RESUMEs the session and a DM sent
    while nobody was connected is replayed — even one from a user the REST catch-up has
    no cursor for (a new DM channel)."""
    procs = discord_replicas(tmp_path, ["r1", "r2"], dsn, model, dc)
    try:
        owner, other, _ = _answered_and_stored(procs, pg, dsn, dc, "first message")
        os.kill(procs[other].proc.pid, signal.SIGSTOP)  # holds the takeover back ...
        try:
            assert procs[owner].stop() == 0
            wait(lambda: dc.fake.connected == 0, timeout=10, what="the connection closed")
            call(dc, lambda: dc.fake.send_dm("second message", user=dc.fake.bob))
        finally:  # ... until the DM was sent while nobody was connected
            os.kill(procs[other].proc.pid, signal.SIGCONT)
        wait(lambda: owners(procs[other]).get(ACCOUNT) == other, timeout=30,
             what="takeover")
        wait(lambda: replies(dc)["echo: second message"] >= 1, timeout=30,
             what="the DM sent during the handover answered")
        time.sleep(1.0)
        assert replies(dc) == Counter({"echo: first message": 1, "echo: second message": 1})
        assert [(r["accepted"], r["replayed"]) for r in dc.fake.resumes] == [(True, 1)]
        assert dc.fake.identify_count == 1
    finally:
        stop_all(procs)


def test_a_paused_discord_owner_woken_after_the_takeover_cannot_overwrite_the_resume_state(
        tmp_path, pg, dsn, model, dc):
    """SIGSTOP of the owner past the lease TTL; a DM sent then reaches only its (unread)
    socket; the other replica takes over, RESUMEs the session (the fake closes the paused
    one's connection) and answers it. SIGCONT: the stale owner reads the DM and the close,
    but its resume-state and catch-up cursor writes are refused by the lease generation,
    it does not take the session back, and the DM is answered once."""
    procs = discord_replicas(tmp_path, ["r1", "r2"], dsn, model, dc)
    paused = None
    try:
        owner, other, _ = _answered_and_stored(procs, pg, dsn, dc, "before the pause")
        paused = procs[owner].proc.pid
        os.kill(paused, signal.SIGSTOP)
        call(dc, dc.fake.send_dm, "during the pause")
        wait(lambda: owners(procs[other]).get(ACCOUNT) == other, timeout=30,
             what="takeover")
        wait(lambda: replies(dc)["echo: during the pause"] == 1, timeout=30,
             what="the DM answered by the new owner")
        new = wait(lambda: settled(pg, dsn, dc, other), timeout=20,
                   what="the new owner's position")
        os.kill(paused, signal.SIGCONT)
        paused = None
        wait(lambda: [x for x in events(procs[owner], "cluster_offset_fenced")
                      if x.get("name") == RESUME_ROW], timeout=30,
             what="the stale owner's resume state write refused")
        wait(lambda: events(procs[owner], "cluster_account_lost"), timeout=30,
             what="the stale owner stops the account")
        call(dc, dc.fake.send_dm, "after the wake")
        wait(lambda: replies(dc)["echo: after the wake"] >= 1, timeout=30,
             what="a message after the wake")
        time.sleep(1.5)
        assert replies(dc) == Counter({f"echo: {t}": 1 for t in (
            "before the pause", "during the pause", "after the wake")})
        value, writer = stored(pg, dsn)
        assert writer == other and value["session_id"] == new["session_id"]
        assert value["seq"] >= new["seq"]
        assert events(procs[owner], "state_document_fenced")  # its catch-up cursor too
        # the stale owner never resumed the session again (only the new owner's RESUME)
        assert [r["accepted"] for r in dc.fake.resumes] == [True]
        assert dc.fake.identify_count == 1
    finally:
        if paused is not None:
            os.kill(paused, signal.SIGCONT)
        stop_all(procs)


async def test_the_stored_position_waits_for_a_message_until_its_on_message_returned():
    """The acknowledged sequence number stops before a MESSAGE_CREATE whose on_message
    still runs (not journaled yet: a crash now must get it replayed), whatever came after
    it; a new session (IDENTIFY) starts the position afresh."""
    from types import SimpleNamespace

    from channels.discord.resume import ResumeState, SessionTracker

    class Store:
        def __init__(self) -> None:
            self.saved: list[dict] = []

        async def load(self):
            return self.saved[-1] if self.saved else None

        async def save(self, value) -> None:
            self.saved.append(value)

    store = Store()
    tracker = SessionTracker(store, "default")
    ws = SimpleNamespace(session_id="s1", sequence=1, gateway="wss://resume.example/")
    tracker.seen(ws, None)  # READY
    ws.sequence = 2
    tracker.seen(ws, "m2")  # MESSAGE_CREATE, on_message running
    ws.sequence = 3
    tracker.seen(ws, None)  # a reaction, handled
    await tracker.flush()
    assert tracker.position() == ResumeState("s1", 1, "wss://resume.example/")
    assert store.saved[-1] == {"session_id": "s1", "seq": 1,
                               "resume_gateway_url": "wss://resume.example/"}
    tracker.done("m2")
    await tracker.flush()
    assert store.saved[-1]["seq"] == 3
    fresh = SessionTracker(store, "default")
    assert await fresh.load() == ResumeState("s1", 3, "wss://resume.example/")
    tracker.seen(SimpleNamespace(session_id="s2", sequence=1, gateway="wss://b/"), None)
    await tracker.flush()
    assert store.saved[-1] == {"session_id": "s2", "seq": 1, "resume_gateway_url": "wss://b/"}
    tracker.seen(SimpleNamespace(session_id="s2", sequence=2, gateway="wss://b/"), "m")
    saves = len(store.saved)
    await tracker.save_final()  # at stop: the position once more, the message not done
    assert len(store.saved) == saves + 1 and store.saved[-1]["seq"] == 1
