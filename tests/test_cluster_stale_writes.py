"""A paused replica's timeline and session-store writes are fenced (issue 15 "Lanes";
gateway/cluster/session_fences.py, runtime/storage/postgres/fence.py). Real ``tidegate
gateway`` replicas on a real PostgreSQL, the fake Telegram and the fake model: the owner
of the session's lane is SIGSTOPped mid-turn past the lease TTL, the other replica takes
the lane over and answers; after SIGCONT the paused replica's turn ends with its stale
answer, and PostgreSQL refuses the events and the session row it writes: the timeline
verifies, holds nothing of the stale turn after the takeover, and the session row is the
new owner's."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest

from tests import cluster_harness
from tests import test_cluster_replicas as replicas
from tests.cluster_harness import database_of, wait
from tests.test_cluster_replicas import _events, owners, replies, start_replicas, stop_all

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

pg, dsn = cluster_harness.pg, cluster_harness.dsn  # fixtures
model, bots = replicas.model, replicas.bots  # fixtures: the timed fake model, 3 bots
KEY = "agent:main:dm:9001"
STALE = "stale answer of the paused replica"


def _ask(bot, text: str) -> None:
    bot.call(bot.fake.inject_message, text, chat_id=9001, user_id=9001)


def test_a_paused_lane_owner_can_neither_append_to_the_timeline_nor_write_the_session(
        tmp_path, pg, dsn, model, bots):
    bot = bots[0]
    procs = start_replicas(tmp_path, ["r1", "r2"], dsn, model, [bot])
    sql = lambda q: pg.psql(q, database_of(dsn)).strip()
    paused = None
    try:
        owner = wait(lambda: owners(procs["r1"]).get("telegram:bot0"), timeout=30,
                     what="an owner")
        other = next(n for n in procs if n != owner)
        _ask(bot, "warm up from u1 now")
        wait(lambda: replies([bot]), timeout=20, what="the session's first answer")
        sid = wait(lambda: sql(f"SELECT session_id FROM sessions WHERE session_key = "
                               f"'{KEY}'"), timeout=20, what="the owner's session row")
        model.server.script_text(STALE, delay=1.0)
        _ask(bot, "first question from u1 now")
        wait(lambda: len(model.server.requests) >= 2, timeout=20, what="the model call")
        paused = procs[owner].proc.pid
        os.kill(paused, signal.SIGSTOP)
        wait(lambda: "echo: first question from u1 now" in replies([bot]), timeout=40,
             what="the taken-over turn answered")
        _ask(bot, "second question from u1 now")
        wait(lambda: len(replies([bot])) >= 3, timeout=30, what="the second answer")
        os.kill(paused, signal.SIGCONT)
        paused = None
        wait(lambda: _events(procs[owner], "cluster_reply_fenced"), timeout=30,
             what="the stale turn's end (its reply refused)")
        _ask(bot, "third question from u1 now")
        wait(lambda: len(replies([bot])) >= 4, timeout=30, what="the third answer")
        time.sleep(1.5)  # a late stale write would land now
        assert Counter(replies([bot])) == {f"echo: {n} from u1 now": 1 for n in (
            "warm up", "first question", "second question", "third question")}
        events = [(t, json.loads(c)) for t, c in (line.split("|", 1) for line in sql(
            f"SELECT event_type, content FROM timeline_events WHERE session_id = '{sid}' "
            "ORDER BY seq").splitlines())]
        inputs = [c["text"] for t, c in events if t == "USER_INPUT"]
        assert inputs == [f"{n} from u1 now" for n in (
            "warm up", "first question", "second question", "third question")]
        answers = [c["text"] for t, c in events if t == "LLM_RESPONSE"]
        assert STALE not in answers and len(answers) == 4
        # the new owner went on with the same session; the row is its own
        assert sql(f"SELECT session_id || ' ' || coalesce(written_by, '-') FROM sessions "
                   f"WHERE session_key = '{KEY}'") == f"{sid} {other}"
        # nor a transcript line
        lines = [json.loads(x)["message"] for x in sql(
            f"SELECT line FROM transcript_lines WHERE session_id = '{sid}' AND seq > 0 "
            "ORDER BY seq").splitlines()]
        said = [(m["role"], m["content"][0]["text"] if isinstance(m["content"], list)
                 else m["content"]) for m in lines]
        assert [t for r, t in said if r == "user"] == inputs
        assert ("assistant", STALE) not in said
        verified = procs[other].cli("timeline", "verify", sid)
        assert "OK" in verified.stdout
        fenced = _events(procs[owner], "timeline_append_fenced")
        assert fenced and all(x["replica"] == owner and x["session_id"] == sid for x in fenced)
    finally:
        if paused is not None:
            os.kill(paused, signal.SIGCONT)
        stop_all(procs)
