"""Several gateway replicas on one real PostgreSQL (issue 15 "Replicas", "Cluster tests"):
replicas are real ``tidegate gateway`` subprocesses, the platforms are the fake Telegram
Bot API servers, the model is the fake OpenAI server, all on 127.0.0.1."""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import cluster_harness
from tests.cluster_harness import database_of, wait
from tests.fakes import fake_telegram
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import GatewayProcess, base_config

pytestmark = [pytest.mark.timeout(400),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

TTL = 3.0  # cluster.lease_ttl for the tests: takeover within a few seconds

pg, dsn = cluster_harness.pg, cluster_harness.dsn  # fixtures


class TimedModel(FakeOpenAI):
    """The fake model, also logging when each request began and ended and whose it was
    (the user text's first word names the session's user)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.spans: list[tuple[str, float, float]] = []

    async def _chat(self, request):
        body = await request.json()
        user = [m for m in body.get("messages", []) if m.get("role") == "user"]
        text = user[-1]["content"] if user else ""
        if isinstance(text, list):
            text = " ".join(p.get("text", "") for p in text if isinstance(p, dict))
        who = text.split()[-2] if len(text.split()) >= 2 else "?"
        t0 = time.monotonic()
        try:
            return await super()._chat(request)
        finally:
            self.spans.append((who, t0, time.monotonic()))


@pytest.fixture
def model():
    m = TimedModel.start_in_thread(latency=0.05)
    yield m
    m.stop()


@pytest.fixture
def bots():
    fakes = [fake_telegram.start_in_thread(token=f"10{i}:TEST-bot-{i}", bot_id=7_000_000_100 + i,
                                           bot_username=f"tidegate_bot_{i}") for i in range(3)]
    yield fakes
    for f in fakes:
        f.stop()


def replica_config(tmp, name, dsn, model, bots, **extra) -> dict:
    accounts = {f"bot{i}": {"token": b.fake.token, "api_base_url": f"{b.url}/bot",
                            "poll_timeout": 1, "dm_policy": "open"}
                for i, b in enumerate(bots)}
    cfg = base_config(tmp / name / "state", model.base_url,
                      channels={"telegram": {"enabled": True, "accounts": accounts}},
                      storage={"backend": "postgres", "dsn": dsn},
                      cluster={"lease_ttl": f"{TTL}s", "replica_id": name},
                      session={"dm_scope": "per-peer"}, **extra)
    cfg["cron"] = {"enabled": False}
    return cfg


def start_replicas(tmp, names, dsn, model, bots, **extra) -> dict[str, GatewayProcess]:
    procs = {}
    for n in names:
        d = tmp / n
        d.mkdir(parents=True, exist_ok=True)
        procs[n] = GatewayProcess(d, replica_config(tmp, n, dsn, model, bots, **extra))
    with ThreadPoolExecutor(len(procs)) as pool:  # started at once
        list(pool.map(lambda p: p.start(timeout=40), procs.values()))
    return procs


def status(gp: GatewayProcess, cli: bool = False) -> dict:
    """The replica's status: ``tidegate status --json`` or its control API."""
    if cli:
        return json.loads(gp.cli("status", "--json", timeout=30).stdout)
    req = urllib.request.Request(f"http://127.0.0.1:{gp.port}/status",
                                 headers={"Authorization": f"Bearer {gp.token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def readyz(gp: GatewayProcess) -> tuple[int, str]:
    """(HTTP status, ``status`` field) of the replica's ``/readyz``."""
    import urllib.error
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{gp.port}/readyz", timeout=10) as r:
            return r.status, json.loads(r.read())["status"]
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["status"]


def owners(gp: GatewayProcess) -> dict[str, str]:
    """account -> owning replica, as ``status`` on ``gp`` reports the cluster."""
    out = {}
    for rid, info in status(gp)["cluster"]["replicas"].items():
        if info["alive"]:
            for acc in info["accounts"]:
                out[acc["account"]] = rid
    return out


def replies(bots) -> list[str]:
    return [m["text"] for b in bots for m in b.call(b.fake.bot_messages)]


def stop_all(procs) -> None:
    live = [p for p in procs.values() if p.proc is not None and p.proc.poll() is None]
    if live:
        with ThreadPoolExecutor(len(live)) as pool:  # SIGTERM to all at once
            assert list(pool.map(lambda p: p.stop(), live)) == [0] * len(live)


def test_three_replicas_300_messages_30_sessions_serial_and_answered_once(tmp_path, dsn, model,
                                                                          bots):
    procs = start_replicas(tmp_path, ["r1", "r2", "r3"], dsn, model, bots)
    try:
        # every account runs on exactly one live replica, spread one per replica
        got = wait(lambda: (o := owners(procs["r1"])) and len(o) == 3 and
                   len(set(o.values())) == 3 and o, timeout=40, what="accounts spread")
        assert set(got) == {"telegram:bot0", "telegram:bot1", "telegram:bot2"}
        sent = []
        for k in range(10):
            batches: dict[int, list[tuple[str, int]]] = defaultdict(list)
            for u in range(30):
                text = f"hello from u{u} m{k}"
                # one session's messages reach all three bots, so all three replicas
                batches[(u + k) % 3].append((text, 9000 + u))
                sent.append(text)
            for i, batch in batches.items():  # one call into the fake's thread per batch
                bots[i].call(lambda f=bots[i].fake, b=batch: [
                    f.inject_message(t, chat_id=c, user_id=c) for t, c in b])
        want = Counter(f"echo: {t}" for t in sent)
        wait(lambda: len(replies(bots)) >= len(sent), timeout=200, what="300 replies")
        time.sleep(1.0)  # a late duplicate would show now
        assert Counter(replies(bots)) == want
        # strictly serial per session: no two model requests of one user overlap
        spans = defaultdict(list)
        for who, t0, t1 in model.server.spans:
            spans[who].append((t0, t1))
        assert len(spans) == 30
        for who, items in spans.items():
            items.sort()
            for (_a0, a1), (b0, _b1) in itertools.pairwise(items):
                assert b0 >= a1, f"{who}: overlapping model requests"
        st = status(procs["r2"])["cluster"]
        assert sum(1 for r in st["replicas"].values() if r["alive"]) == 3
        # the cross-replica path was taken: messages were handed to the lane's replica
        events = Counter(x.get("event") for p in procs.values() for x in p.log_lines())
        assert events["cluster_work_forwarded"] > 0 and events["cluster_work_claimed"] > 0
        assert events["cluster_work_taken_over"] == 0  # nobody died
    finally:
        stop_all(procs)


def test_kill9_of_the_telegram_owner_mid_turn_takes_over_and_answers_once(tmp_path, pg, dsn,
                                                                           model, bots):
    bot = bots[0]
    procs = start_replicas(tmp_path, ["r1", "r2", "r3"], dsn, model, [bot])
    try:
        owner = wait(lambda: owners(procs["r1"]).get("telegram:bot0"), timeout=30,
                     what="an owner")
        bot.call(bot.fake.inject_message, "warm up from u1 now", chat_id=9001, user_id=9001)
        wait(lambda: replies([bot]), timeout=20, what="the session's first answer")
        model.server.script_hang()  # the next model call never answers
        bot.call(bot.fake.inject_message, "first question from u1 now", chat_id=9001,
                 user_id=9001)
        wait(lambda: len(model.server.requests) >= 2 and len(model.server.spans) == 1,
             timeout=20, what="the turn's model call")
        procs[owner].kill9()
        killed_at = time.monotonic()
        survivors = {n: p for n, p in procs.items() if n != owner}
        probe = next(iter(survivors.values()))
        new_owner = wait(lambda: (o := owners(probe).get("telegram:bot0")) != owner and o,
                         timeout=30, what="takeover")
        assert new_owner in survivors
        wait(lambda: "echo: first question from u1 now" in replies([bot]), timeout=30,
             what="the interrupted message answered")
        took = time.monotonic() - killed_at
        bot.call(bot.fake.inject_message, "second question from u1 now", chat_id=9001,
                 user_id=9001)
        wait(lambda: len(replies([bot])) >= 3, timeout=30, what="the next message answered")
        time.sleep(1.5)  # a redelivered update or a second run would show now
        assert Counter(replies([bot])) == {"echo: warm up from u1 now": 1,
                                           "echo: first question from u1 now": 1,
                                           "echo: second question from u1 now": 1}
        assert took < 4 * TTL + 5
        # tidegate status on a survivor: the dead replica, the account's new owner
        cluster = status(probe, cli=True)["cluster"]
        assert not cluster["replicas"][owner]["alive"]
        assert [a["account"] for a in cluster["replicas"][new_owner]["accounts"]] == \
            ["telegram:bot0"]
        # the human form (README: `tidegate status` lists replicas, accounts, lanes and
        # lease ages): it had no cluster lines at all, only --json did
        text = probe.cli("status", timeout=30).stdout
        assert f"  replica {owner}: dead, lease age " in text
        line = next(x for x in text.splitlines() if x.startswith(f"  replica {new_owner}"))
        assert ": alive, lease age " in line and "accounts: telegram:bot0 (held " in line
        assert "; lanes: " in line and "cluster: replica " in text and "postgres up" in text
        events = Counter(x.get("event") for p in survivors.values() for x in p.log_lines())
        assert events["cluster_work_taken_over"] == 1
        # the user's line was committed before the killed replica called the model; the
        # re-run finds it in the session's transcript and does not write it again
        users = pg.psql("SELECT t.line FROM transcript_lines t JOIN sessions s ON "
                        "s.session_id = t.session_id WHERE s.session_key = "
                        "'agent:main:dm:9001' AND t.line LIKE '%\"role\":\"user\"%' "
                        "ORDER BY t.seq", database_of(dsn)).splitlines()
        assert [x.split('"text":"')[1].split(" from")[0] for x in users] == [
            "warm up", "first question", "second question"]
    finally:
        stop_all(procs)


def test_two_replicas_starting_at_once_migrate_once_and_ride_out_a_postgres_outage(
        tmp_path, pg, dsn, model, bots):
    bot = bots[0]
    procs = start_replicas(tmp_path, ["r1", "r2"], dsn, model, [bot])  # empty database
    try:
        rows = pg.psql("SELECT version FROM tidegate_migrations", database_of(dsn))
        versions = [int(v) for v in rows.split()]
        assert len(versions) == len(set(versions)) and 100 in versions
        applied = [x for p in procs.values() for x in p.log_lines()
                   if x.get("event") == "storage_migration_applied" and x.get("version") == 100]
        assert len(applied) == 1  # one replica applied it; the other found it applied
        wait(lambda: owners(procs["r1"]).get("telegram:bot0"), timeout=30, what="an owner")
        bot.call(bot.fake.inject_message, "before the outage from u1 now", chat_id=9001,
                 user_id=9001)
        wait(lambda: len(replies([bot])) == 1, timeout=30, what="a reply")
        pg.stop()
        stopped = time.monotonic()
        try:
            for p in procs.values():  # every replica reports the outage while it lasts
                st = wait(lambda p=p: (s := status(p))["cluster"]["postgres"]["state"] ==
                          "down" and s, timeout=8, what="outage in status")
                assert st["cluster"]["postgres"]["down_since"] is not None
                assert any("postgres unreachable" in x for x in st["problems"])
                assert readyz(p) == (503, "degraded: postgres unreachable")
            bot.call(bot.fake.inject_message, "during the outage from u1 now", chat_id=9001,
                     user_id=9001)
            # a replica started now waits for PostgreSQL (it used to exit after 1.3 s)
            (tmp_path / "r3").mkdir()
            late = GatewayProcess(tmp_path / "r3", replica_config(tmp_path, "r3", dsn, model,
                                                                  [bot]))
            starting = ThreadPoolExecutor(1).submit(late.start, 60)
            waiting = wait(lambda: (r := late.cli("status", "--json", check=False)).stdout
                           and json.loads(r.stdout).get("state") == "waiting for PostgreSQL"
                           and json.loads(r.stdout), timeout=8, what="r3 waiting")
            assert waiting["waiting"]["attempts"] >= 1 and late.proc.poll() is None
            time.sleep(max(0.0, 10 - (time.monotonic() - stopped)))
        finally:
            pg.start()
        for p in procs.values():  # recovered without a restart
            wait(lambda p=p: status(p)["cluster"]["postgres"]["state"] == "up", timeout=20,
                 what="recovery")
            assert p.proc.poll() is None
            wait(lambda p=p: readyz(p)[0] == 200, timeout=10, what="ready again")
        procs["r3"] = starting.result(timeout=60)  # it started once PostgreSQL was back
        wait(lambda: len(replies([bot])) >= 2, timeout=30, what="the held message answered")
        bot.call(bot.fake.inject_message, "after the outage from u1 now", chat_id=9001,
                 user_id=9001)
        wait(lambda: len(replies([bot])) >= 3, timeout=30, what="a message after")
        time.sleep(1.0)
        assert Counter(replies([bot])) == {f"echo: {w} the outage from u1 now": 1
                                           for w in ("before", "during", "after")}
    finally:
        stop_all(procs)


def test_stop_sent_through_another_replica_stops_the_turn_where_it_runs(tmp_path, dsn,
                                                                        model, bots):
    procs = start_replicas(tmp_path, ["r1", "r2"], dsn, model, bots[:2])
    try:
        got = wait(lambda: (o := owners(procs["r1"])) and len(set(o.values())) == 2 and o,
                   timeout=40, what="one account per replica")
        model.server.script_hang()
        bot0, bot1 = bots[0], bots[1]
        bot0.call(bot0.fake.inject_message, "a long task from u7 now", chat_id=9007,
                  user_id=9007)
        runner = got["telegram:bot0"]
        other = next(n for n in procs if n != runner)
        key = "agent:main:dm:9007"
        wait(lambda: key in status(procs[other])["cluster"]["replicas"][runner]["lanes"],
             timeout=20, what="the lane seen from the other replica")
        assert got["telegram:bot1"] == other
        bot1.call(bot1.fake.inject_message, "/stop", chat_id=9007, user_id=9007)
        wait(lambda: any(x.get("event") == "lane_abort" and x.get("aborted")
                         for x in procs[runner].log_lines()), timeout=20,
             what="the turn stopped on the replica running it")
        wait(lambda: "Stopped." in [m["text"] for m in bot1.call(bot1.fake.bot_messages)],
             timeout=20, what="the /stop reply")
    finally:
        stop_all(procs)


def _events(gp: GatewayProcess, event: str) -> list[dict]:
    try:
        return [x for x in gp.log_lines() if x.get("event") == event]
    except ValueError:  # a line being written
        return []


def test_a_paused_owner_resumed_after_a_takeover_neither_replies_nor_commits_offsets(
        tmp_path, pg, dsn, model, bots):
    """SIGSTOP of the replica that owns the Telegram account and runs a turn, past the
    lease TTL: the other replica takes the account and the turn over and answers. SIGCONT:
    the paused replica gets its (stale) model answer but its reply mark is fenced, so the
    chat sees one answer; its account is stopped and it never writes the offset."""
    import os
    import signal

    bot = bots[0]
    procs = start_replicas(tmp_path, ["r1", "r2"], dsn, model, [bot])
    paused = None
    try:
        owner = wait(lambda: owners(procs["r1"]).get("telegram:bot0"), timeout=30,
                     what="an owner")
        other = next(n for n in procs if n != owner)
        model.server.script_text("stale answer of the paused replica", delay=1.0)
        bot.call(bot.fake.inject_message, "first question from u1 now", chat_id=9001,
                 user_id=9001)
        wait(lambda: len(model.server.requests) >= 1, timeout=20, what="the model call")
        paused = procs[owner].proc.pid
        os.kill(paused, signal.SIGSTOP)
        wait(lambda: owners(procs[other]).get("telegram:bot0") == other, timeout=30,
             what="takeover of the account")
        wait(lambda: "echo: first question from u1 now" in replies([bot]), timeout=30,
             what="the taken-over turn answered")
        bot.call(bot.fake.inject_message, "second question from u1 now", chat_id=9001,
                 user_id=9001)
        wait(lambda: len(replies([bot])) >= 2, timeout=30, what="the second answer")
        offset = lambda: pg.psql("SELECT value::text || ' ' || written_by FROM "
                                 "cluster_channel_state", database_of(dsn)).strip()
        before = wait(offset, timeout=10, what="the new owner's offset")
        assert before.endswith(f" {other}")
        os.kill(paused, signal.SIGCONT)
        paused = None
        wait(lambda: _events(procs[owner], "cluster_reply_fenced"), timeout=30,
             what="the stale reply fenced")
        assert _events(procs[owner], "cluster_lane_lost")  # it noticed its pause
        wait(lambda: _events(procs[owner], "cluster_account_lost"), timeout=30,
             what="the paused replica stops the account")
        bot.call(bot.fake.inject_message, "third question from u1 now", chat_id=9001,
                 user_id=9001)
        wait(lambda: len(replies([bot])) >= 3, timeout=30, what="the third answer")
        time.sleep(1.5)  # a late duplicate or a stale reply would show now
        assert Counter(replies([bot])) == {f"echo: {n} question from u1 now": 1
                                           for n in ("first", "second", "third")}
        value, writer = offset().split()
        assert writer == other and int(value) > int(before.split()[0])
        stale = [x for x in procs[owner].log_lines()
                 if x.get("event") == "cluster_offset_fenced"]
        assert all(x["replica"] == owner for x in stale)  # refused, never written
        # the answer and the error notice that follows the refusal: both fenced
        assert status(procs[owner])["cluster"]["fenced"] >= 1
    finally:
        if paused is not None:
            os.kill(paused, signal.SIGCONT)
        stop_all(procs)


def test_new_sent_through_another_replica_runs_on_the_lane_after_its_turn(tmp_path, dsn,
                                                                          model, bots):
    """/new received by the replica that does not run the session's lane is run by the
    one that does, after the turn it is running (in order, never concurrently), and its
    notice reaches the chat it came from."""
    procs = start_replicas(tmp_path, ["r1", "r2"], dsn, model, bots[:2])
    try:
        got = wait(lambda: (o := owners(procs["r1"])) and len(set(o.values())) == 2 and o,
                   timeout=40, what="one account per replica")
        runner = got["telegram:bot0"]
        other = next(n for n in procs if n != runner)
        bot0, bot1 = bots[0], bots[1]
        model.server.script_text("a slow answer", delay=3.0)
        bot0.call(bot0.fake.inject_message, "a long task from u7 now", chat_id=9007,
                  user_id=9007)
        key = "agent:main:dm:9007"
        wait(lambda: key in status(procs[other])["cluster"]["replicas"][runner]["lanes"],
             timeout=20, what="the lane seen from the other replica")
        bot1.call(bot1.fake.inject_message, "/new", chat_id=9007, user_id=9007)
        wait(lambda: "Started a new session." in [m["text"] for m in
                                                  bot1.call(bot1.fake.bot_messages)],
             timeout=30, what="the /new notice on the chat it came from")
        assert "a slow answer" in [m["text"] for m in bot0.call(bot0.fake.bot_messages)]
        created = {n: [x for x in p.log_lines() if x.get("event") == "session_created"
                       and x.get("reason") == "new"] for n, p in procs.items()}
        assert len(created[runner]) == 1 and created[other] == []
        turn_done = next(x["ts"] for x in procs[runner].log_lines()
                         if x.get("event") == "turn_done" and x.get("session_key") == key)
        assert created[runner][0]["ts"] >= turn_done  # after the running turn, in order
        assert any(x.get("event") == "cluster_work_forwarded"
                   for x in procs[other].log_lines())
    finally:
        stop_all(procs)


def test_status_text_shows_the_outage_each_replica_and_where_an_account_runs():
    """`tidegate status` (no --json) on a replica: PostgreSQL down with its error, the
    other replica's account marked as running there, lanes listed by session key."""
    from gateway.cli.output import render_status
    cluster = {"replica": "a", "lease_ttl": 15.0,
               "postgres": {"state": "down", "down_for_s": 4.2, "last_error": "refused"},
               "replicas": {
                   "a": {"host": "h1", "pid": 10, "port": 1, "lease_age_s": 0.3,
                         "alive": True, "stopped": False, "accounts": [],
                         "lanes": [f"agent:main:dm:{i}" for i in range(12)]},
                   "b": {"host": "h2", "pid": 20, "port": 2, "lease_age_s": 19.5,
                         "alive": False, "stopped": False,
                         "accounts": [{"account": "telegram:bot0", "held_s": 40.0}],
                         "lanes": []}}}
    text = render_status({"pid": 10, "uptime_s": 5, "cluster": cluster,
                          "channels": {"telegram:bot0": {"state": "stopped"}}})
    assert "channel telegram:bot0: stopped (runs on replica b)" in text
    assert "cluster: replica a, lease_ttl 15s, postgres down for 4.2s (refused)" in text
    assert ("  replica a (this one): alive, lease age 0.3s, pid 10 on h1:1; accounts: "
            "none; lanes: 12 (agent:main:dm:0, ") in text and ", +2 more)" in text
    assert ("  replica b: dead, lease age 19.5s, pid 20 on h2:2; accounts: telegram:bot0 "
            "(held 40s); lanes: 0") in text
