"""Every entry point runs a session's turn on the replica that holds its lane (README
"Replicas"): the OpenAI-compatible API (plain and streamed), ``tidegate agent -m``, the
control API's session commands and the platforms. Real ``tidegate gateway`` replicas on a
real PostgreSQL, the fake Telegram Bot API and a fake model that logs when each of its
calls began and ended; the replicas are shared by the module's tests (started once)."""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import cluster_harness
from tests.cluster_harness import database_of, wait
from tests.fakes import fake_telegram
from tests.helpers import GatewayProcess
from tests.test_cluster_replicas import TimedModel, owners, replica_config, replies, stop_all

pytestmark = [pytest.mark.timeout(200),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

pg = cluster_harness.pg  # fixture (module scope)


@pytest.fixture(scope="module")
def model():
    m = TimedModel.start_in_thread(latency=0.05)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def bot():
    b = fake_telegram.start_in_thread(token="100:TEST-bot-0", bot_id=7_000_000_100,
                                      bot_username="tidegate_bot_0")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def hbmodel():
    """The model of agent ``hb`` (its heartbeat and turns only)."""
    m = TimedModel.start_in_thread(latency=0.3)
    yield m
    m.stop()


def with_heartbeat_agent(cfg: dict, name: str, hbmodel, workspace) -> None:
    """Agent ``hb`` beside ``main``: its own model, a shared workspace with a
    HEARTBEAT.md, a heartbeat every 3 s on r0 (every hour on the others: their timers
    claim no slot during the tests, but they can run a beat handed to them)."""
    cfg["models"]["providers"]["hbfake"] = {"api": "openai", "base_url": hbmodel.base_url,
                                            "api_key": "sk-test-0123456789abcdef"}
    cfg["agents"]["list"] = [{"id": "main"}, {
        "id": "hb", "model": "hbfake/fake-model", "workspace": str(workspace),
        "heartbeat": {"every": "3s" if name == "r0" else "1h", "target": "none"}}]


@pytest.fixture(scope="module")
def slowmodel():
    """A model that takes 4 s per call (provider ``slowfake``: subagent runs that ask
    for it)."""
    m = TimedModel.start_in_thread(latency=4.0)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def cluster(pg, model, hbmodel, slowmodel, bot, tmp_path_factory):
    """Three replicas (r0, r1, r2) with the OpenAI API on, one Telegram account, cron,
    agent ``hb`` with a heartbeat."""
    dsn = pg.create_database()
    tmp = tmp_path_factory.mktemp("cluster")
    workspace = tmp / "hb-workspace"
    workspace.mkdir()
    (workspace / "HEARTBEAT.md").write_text("# Checks\n\n- look at the tide gauge\n")
    procs = {}
    for n in ("r0", "r1", "r2"):
        cfg = replica_config(tmp, n, dsn, model, [bot])
        cfg["channels"]["openai_api"] = {"enabled": True}
        cfg["cron"] = {"enabled": True}
        with_heartbeat_agent(cfg, n, hbmodel, workspace)
        cfg["models"]["providers"]["slowfake"] = {
            "api": "openai", "base_url": slowmodel.base_url,
            "api_key": "sk-test-0123456789abcdef"}
        (tmp / n).mkdir()
        procs[n] = GatewayProcess(tmp / n, cfg)
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda p: p.start(timeout=40), procs.values()))
    procs["dsn"] = dsn  # type: ignore[assignment]
    yield procs
    stop_all({k: v for k, v in procs.items() if k != "dsn"})


def chat(gp, user: str, text: str, stream: bool = False) -> tuple[str, str]:
    """POST /v1/chat/completions on replica ``gp``: (reply text, X-Session-Key)."""
    body = {"model": "tidegate/main", "user": user, "stream": stream,
            "messages": [{"role": "user", "content": text}]}
    req = urllib.request.Request(f"http://127.0.0.1:{gp.port}/v1/chat/completions",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {gp.token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        key = r.headers["X-Session-Key"]
        raw = r.read().decode()
    if not stream:
        return json.loads(raw)["choices"][0]["message"]["content"], key
    chunks = [json.loads(x[6:]) for x in raw.split("\n\n") if x.startswith("data: {")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c["choices"]), key


def api(gp, method: str, path: str, body: dict | None = None):
    """The replica's control API (what the CLI's session commands call)."""
    req = urllib.request.Request(f"http://127.0.0.1:{gp.port}{path}", method=method,
                                 data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": f"Bearer {gp.token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def overlaps(model, who: set[str]) -> int:
    """Pairs of model calls of one session (user word) that overlapped in time."""
    spans = defaultdict(list)
    for w, t0, t1 in model.server.spans:
        if w in who:
            spans[w].append((t0, t1))
    return sum(1 for items in spans.values()
               for a, b in itertools.combinations(sorted(items), 2) if b[0] < a[1])


def session_ids(pg, dsn: str, key: str) -> list[str]:
    rows = pg.psql(f"SELECT session_id FROM sessions WHERE session_key = '{key}'",
                   database_of(dsn))
    return rows.split()


def timelines(pg, dsn: str, key: str) -> int:
    return int(pg.psql(f"SELECT count(*) FROM timelines WHERE session_key = '{key}'",
                       database_of(dsn)).strip())


def test_one_user_on_three_replicas_at_once_is_one_serial_session(cluster, model, pg):
    """The same ``user`` sent to three replicas at the same moment (one streamed): one
    session id, one timeline, model calls one after another, every reply right."""
    names = ["r0", "r1", "r2"]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda i: chat(cluster[names[i]], "ua", f"hi from ua m{i}",
                                           stream=i == 1), range(3)))
    assert sorted(t for t, _k in got) == [f"echo: hi from ua m{i}" for i in range(3)]
    key = got[0][1]
    assert {k for _t, k in got} == {key}
    assert len(session_ids(pg, cluster["dsn"], key)) == 1
    assert timelines(pg, cluster["dsn"], key) == 1
    assert len([s for s in model.server.spans if s[0] == "ua"]) == 3
    assert overlaps(model, {"ua"}) == 0
    events = [x.get("event") for p in names for x in cluster[p].log_lines()]
    assert "cluster_work_forwarded" in events  # the holder ran the others' turns


def test_a_streamed_request_to_another_replica_streams_the_holders_deltas(cluster):
    """The lane of a session runs on r0 (its first message went there); a streamed request
    for it on r1 runs on r0, whose text deltas r1's SSE response carries."""
    r0, r1 = cluster["r0"], cluster["r1"]
    assert chat(r0, "ud", "first from ud m0")[0] == "echo: first from ud m0"
    before = api(r0, "GET", "/status")["cluster"]["event_batches_relayed"]
    text, _key = chat(r1, "ud", "streamed from ud m1", stream=True)
    assert text == "echo: streamed from ud m1"
    assert api(r0, "GET", "/status")["cluster"]["event_batches_relayed"] > before
    assert api(r1, "GET", "/status")["cluster"]["turns_answered_elsewhere"] >= 1


def test_two_replicas_sessions_by_messages_alternating_never_overlap(cluster, model, pg):
    """8 sessions × 3 messages, each message to the other replica than the last, all at
    once: 0 overlapping pairs of model calls within a session, one id per session."""
    users = [f"ub{i}" for i in range(8)]
    jobs = [(cluster[("r0", "r1")[(u + k) % 2]], users[u], f"hi from {users[u]} m{k}")
            for k in range(3) for u in range(8)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda j: chat(*j), jobs))
    assert sorted(t for t, _k in got) == sorted(f"echo: {j[2]}" for j in jobs)
    assert overlaps(model, set(users)) == 0
    for key in {k for _t, k in got}:
        assert len(session_ids(pg, cluster["dsn"], key)) == 1


def test_a_telegram_session_run_on_one_replica_is_seen_and_written_from_another(
        cluster, model, pg, bot):
    """A Telegram session whose lane runs on replica A: on replica B, ``sessions list``
    ``sessions show`` and ``sessions outcomes`` show it, a message (``agent -m``) into its key answers in the
    same session (no new id), a ``system event`` reaches its next turn, whose model
    request also holds the CLI message and the earlier Telegram one; ``sessions reset``
    gives it one new session id."""
    names = ["r0", "r1", "r2"]
    owner = wait(lambda: owners(cluster["r0"]).get("telegram:bot0"), timeout=30,
                 what="an owner")
    other = cluster[next(n for n in names if n != owner)]
    key = "agent:main:dm:9100"
    bot.call(bot.fake.inject_message, "first telegram from uc now", chat_id=9100,
             user_id=9100)
    wait(lambda: "echo: first telegram from uc now" in replies([bot]), timeout=30,
         what="the Telegram answer")
    [sid] = session_ids(pg, cluster["dsn"], key)
    # what `tidegate sessions list|show` and `tidegate agent -m` ask the control API
    listed = api(other, "GET", "/api/sessions")
    assert [r["session_id"] for r in listed if r["session_key"] == key] == [sid]
    assert api(other, "GET", f"/api/sessions/{key}")["session_id"] == sid
    got = wait(lambda: api(other, "GET", f"/api/outcomes?session_key={key}")["outcomes"],
               timeout=10, what="the outcome seen from the other replica")
    assert [(r["outcome"], r["channel"]) for r in got] == [("replied", "telegram")]
    out = api(other, "POST", "/api/agent", {"session_key": key,
                                            "message": "cli note from uc now"})
    assert out["reply"] == "echo: cli note from uc now" and out["session_id"] == sid
    assert session_ids(pg, cluster["dsn"], key) == [sid]
    queued = api(other, "POST", "/api/system-event", {"session_key": key,
                                                      "text": "deploy finished for uc"})
    assert queued["queued"] is True
    before = len(model.server.requests)
    bot.call(bot.fake.inject_message, "second telegram from uc now", chat_id=9100,
             user_id=9100)
    wait(lambda: "echo: second telegram from uc now" in replies([bot]), timeout=30,
         what="the second Telegram answer")
    request = next(r.json for r in model.server.requests[before:]
                   if "second telegram" in json.dumps(r.json))
    users = [m["content"] for m in request["messages"] if m.get("role") == "user"]
    text = json.dumps(users)
    assert "first telegram from uc" in text and "cli note from uc" in text
    assert text.index("first telegram") < text.index("cli note") < text.index("second")
    assert "deploy finished for uc" in json.dumps(request)  # the system event, drained
    assert session_ids(pg, cluster["dsn"], key) == [sid]
    assert timelines(pg, cluster["dsn"], key) == 1
    reset = api(other, "POST", f"/api/sessions/{key}/reset")
    assert reset["old_session_id"] == sid and reset["session_id"] not in (sid, None)
    assert session_ids(pg, cluster["dsn"], key) == [reset["session_id"]]


def test_a_subagent_started_on_one_replica_is_listed_and_shown_on_every_replica(
        cluster, model, pg):
    """A subagent run spawned by a turn on r0: the control API (``subagents list|show``
    of the running gateway) on r1, the CLI on r2 (PostgreSQL, the daemon not asked),
    the ``/subagents`` chat command and the ``session_status`` tool on a replica that
    runs the session's lane later all answer with it (and name r0, where it ran)."""
    key = "agent:main:dm:9300"
    r0, r1, r2 = cluster["r0"], cluster["r1"], cluster["r2"]
    model.server.script_tool_call("sessions_spawn", {"task": "count tides for us9300",
                                                     "label": "tides"})
    api(r0, "POST", "/api/agent", {"session_key": key,
                                   "message": "spawn a helper for us9300 now"})
    [run] = [r for r in api(r0, "GET", "/api/subagents")["runs"]
             if r["requester_session_key"] == key]
    ended = wait(lambda: (got := [r for r in api(r1, "GET", "/api/subagents")["runs"]
                                  if r["run_id"] == run["run_id"]])
                 and got[0]["announce_state"] == "announced" and got[0], timeout=30,
                 what="the run, ended and announced, seen on r1")
    assert ended["replica"] == "r0" and ended["outcome"]["status"] == "ok"
    assert ended["label"] == "tides" and ended["task"] == "count tides for us9300"
    shown = api(r1, "GET", f"/api/subagents/{run['run_id']}")["run"]
    assert shown["child_session_key"] == run["child_session_key"]
    listed = json.loads(r2.cli("subagents", "list", "--json").stdout)
    assert run["run_id"] in [r["run_id"] for r in listed]
    one = json.loads(r2.cli("subagents", "show", run["run_id"], "--json").stdout)
    assert one["replica"] == "r0" and one["outcome"]["status"] == "ok"
    # the session's lane moves on (given back idle on r0, taken by r1): r1 knows the run
    lease = f"SELECT count(*) FROM cluster_leases WHERE name = 'lane:{key}'"
    wait(lambda: pg.psql(lease, database_of(cluster["dsn"])).strip() == "0", timeout=20,
         what="r0 gives the idle lane back")
    text = api(r1, "POST", "/api/agent", {"session_key": key, "message": "/subagents"})
    assert text["reply"].startswith(f"{run['run_id']} tides: ok on replica r0")
    before = len(model.server.requests)
    model.server.script_tool_call("session_status", {})
    api(r1, "POST", "/api/agent", {"session_key": key, "message": "status for us9300"})
    tools = [m for r in model.server.requests[before:] for m in r.json["messages"]
             if m.get("role") == "tool"]
    assert any(run["run_id"] in json.dumps(m) for m in tools)
    holder = pg.psql(f"SELECT replica_id FROM cluster_leases WHERE name = 'lane:{key}'",
                     database_of(cluster["dsn"])).strip()
    assert holder in ("r1", "")  # the status turn ran on r1, not where the run ran


def test_an_isolated_cron_job_slower_than_its_interval_runs_serially_once_per_due_time(
        cluster, model, pg):
    """A job every 1 s whose turn takes 1.5 s: the replicas' timers claim its due times
    (each once: the occurrence ledger) and a replica whose due time comes while another
    replica still runs the job's session waits for that lane instead of running beside
    it: the job's model calls never overlap, and there is one per claimed due time."""
    r0 = cluster["r0"]
    for _ in range(3):
        model.server.script_text("a slow tick", delay=1.5)
    job = json.loads(r0.cli("cron", "add", "--name", "slow", "--every", "1s",
                            "--session", "isolated", "--message", "tick for uj9400 now",
                            "--json").stdout)
    wait(lambda: len([s for s in model.server.spans if s[0] == "uj9400"]) >= 2,
         timeout=40, what="two runs of the job")
    r0.cli("cron", "rm", job["id"])
    db = database_of(cluster["dsn"])
    runs = lambda: pg.psql(f"SELECT replica_id, state FROM cluster_cron_runs WHERE "
                           f"job_id = '{job['id']}'", db).split()
    wait(lambda: all(r.endswith("|done") for r in runs()), timeout=30,
         what="the runs in flight finished")
    spans = [s for s in model.server.spans if s[0] == "uj9400"]
    ran = pg.psql(f"SELECT replica_id FROM cluster_cron_runs WHERE job_id = '{job['id']}' "
                  "AND status IS DISTINCT FROM 'skipped'", db).split()
    assert overlaps(model, {"uj9400"}) == 0
    # one model call per due time claimed to run, none twice (a due time that passed while
    # the previous run still went is claimed too, as skipped: it runs nothing)
    assert len(spans) == len(ran)
    assert len({r.split("|")[0] for r in runs()}) >= 2  # the due times moved between replicas


def test_a_heartbeat_for_a_session_another_replica_runs_is_run_there(cluster, hbmodel, pg):
    """r0's heartbeat timer beats agent ``hb`` every 3 s while r1 runs the heartbeat
    session's lane (a message every 0.5 s): r0 hands each beat to r1, which runs it on
    that lane between the messages (or skips it while a turn runs, as on one host); r0
    runs none itself, and no beat's model call overlaps a turn of the session."""
    r0, r1 = cluster["r0"], cluster["r1"]
    key = "agent:hb:main"
    def holder() -> str:
        return pg.psql(f"SELECT replica_id FROM cluster_leases WHERE name = 'lane:{key}'",
                       database_of(cluster["dsn"])).strip()

    def r1_holds() -> bool:  # r0's beats keep the lane there until it is idle for 2 s
        if holder() == "":  # given back: the next message to r1 takes it
            api(r1, "POST", "/api/agent", {"session_key": key, "message": "first from uh"})
        return holder() == "r1"
    wait(r1_holds, timeout=30, what="r1 runs the heartbeat session's lane", every=0.05)
    start = time.time()
    while time.time() - start < 8:
        api(r1, "POST", "/api/agent", {"session_key": key, "message": "more from uh now"})
        time.sleep(0.5)
    end = time.time()

    def beats(gp, **match):
        return [x for x in gp.log_lines() if x.get("event") == "heartbeat"
                and x.get("agent") == "hb" and start + 0.5 < _ts(x) < end
                and all(x.get(k) == v for k, v in match.items())]

    handed = [x for x in r0.log_lines() if x.get("event") == "cluster_heartbeat_handed"
              and x.get("session_key") == key]
    assert len(handed) >= 2 and {x["replica"] for x in handed} == {"r1"}
    ran_there = beats(r1, trigger="handed from another replica")
    assert ran_there and any(x["outcome"] != "skipped" for x in ran_there)
    assert all(x["outcome"] == "skipped" for x in beats(r0))  # "ran on replica r1"
    spans = sorted((t0, t1) for _w, t0, t1 in hbmodel.server.spans)
    assert all(b[0] >= a[1] for a, b in itertools.pairwise(spans))


def _ts(line: dict) -> float:
    from runtime.clock import parse_iso
    return parse_iso(line["ts"])


def test_a_system_event_for_a_session_whose_lane_is_free_reaches_its_next_turn(
        cluster, model, pg):
    """``system event`` on r1 for a session no replica runs right now (its lane given
    back idle): r1 takes the lane and keeps the event for the session's next turn, which
    a message through r2 then runs there, with the event in its prompt. (Taking the free
    lane for an event failed with a ValueError: the cron ``main`` jobs' and subagent
    announces' events went the same way.)"""
    key = "agent:main:dm:9500"
    r0, r1, r2 = cluster["r0"], cluster["r1"], cluster["r2"]
    api(r0, "POST", "/api/agent", {"session_key": key, "message": "hello from uf now"})
    db = database_of(cluster["dsn"])
    wait(lambda: pg.psql(f"SELECT count(*) FROM cluster_leases WHERE name = 'lane:{key}'",
                         db).strip() == "0", timeout=20, what="the lane given back")
    queued = api(r1, "POST", "/api/system-event", {"session_key": key,
                                                   "text": "the tide turned for uf"})
    assert queued["queued"] is True
    before = len(model.server.requests)
    out = api(r2, "POST", "/api/agent", {"session_key": key, "message": "next from uf now"})
    assert out["reply"] == "echo: next from uf now"
    request = next(r.json for r in model.server.requests[before:]
                   if "next from uf" in json.dumps(r.json))
    assert "the tide turned for uf" in json.dumps(request)


def test_a_subagent_announce_to_a_session_another_replica_now_runs_is_run_there(
        cluster, model, pg):
    """A subagent spawned on r0 runs 4 s; meanwhile the requester session's lane moves to
    r1 (messages through r1). The announce — its system event and the system-event turn
    that relays it — goes to r1, which runs the turn with the event on the session's lane
    (r0 neither waits for the lane nor runs a turn beside r1's)."""
    key = "agent:main:dm:9700"
    r0, r1 = cluster["r0"], cluster["r1"]
    model.server.script_tool_call("sessions_spawn", {"task": "slow count for ug9700",
                                                     "model": "slowfake/fake-model"})
    api(r0, "POST", "/api/agent", {"session_key": key,
                                   "message": "spawn a slow helper for ug9700 now"})
    [run] = [r for r in api(r0, "GET", "/api/subagents")["runs"]
             if r["requester_session_key"] == key]
    db = database_of(cluster["dsn"])

    def holder() -> str:
        return pg.psql(f"SELECT replica_id FROM cluster_leases WHERE name = 'lane:{key}'",
                       db).strip()
    wait(lambda: holder() == "", timeout=20, what="r0 gives the idle lane back", every=0.05)
    before = len(model.server.requests)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # r1 runs the session's lane meanwhile
        api(r1, "POST", "/api/agent", {"session_key": key,
                                       "message": "meanwhile from ug9700 now"})
        got = api(r1, "GET", f"/api/subagents/{run['run_id']}")["run"]
        if got["announce_state"] == "announced":
            break
        time.sleep(0.3)
    assert got["announce_state"] == "announced" and got["outcome"]["status"] == "ok"
    handed = [x for x in r0.log_lines() if x.get("event") == "cluster_wake_handed"
              and x.get("session_key") == key]
    assert [x["replica"] for x in handed] == ["r1"]
    relayed = [r.json for r in model.server.requests[before:]
               if run["run_id"] in json.dumps(r.json)]
    # the announce's event reached a turn of the session on r1: the handed system-event
    # turn, or a message's turn there that drained it first
    assert relayed
