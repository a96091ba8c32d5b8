"""Reproduction of the outage takeover (run: ``pytest bench/cluster_outage_repro.py``; ~25 s,
too slow for the suite, whose fast test is tests/test_cluster_outage.py). A PostgreSQL
outage is not a replica's death (gateway/cluster/db.py ``peer_ttl``): every
heartbeat goes stale while the database is down, so the replica that reconnects first
must not take over the accounts, lanes and turns of the others, which are still
reconnecting. Real ``tidegate gateway`` replicas on a real PostgreSQL that the test stops;
the owner is SIGSTOPped across the restart so that it reconnects a moment after the
other one (as it does under load)."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest

from tests import cluster_harness
from tests import test_cluster_replicas as replicas
from tests.cluster_harness import wait
from tests.test_cluster_replicas import TTL, owners, replies, start_replicas, status, stop_all

pytestmark = [pytest.mark.timeout(200),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

pg, dsn = cluster_harness.pg, cluster_harness.dsn  # fixtures (a private server: stopped)
model, bots = replicas.model, replicas.bots  # fixtures


def _events(gp, event: str) -> list[dict]:
    try:
        return [x for x in gp.log_lines() if x.get("event") == event]
    except ValueError:  # a line being written
        return []


def test_a_turn_live_across_an_outage_stays_with_its_replica(tmp_path, pg, dsn, model,
                                                             bots):
    """It used to be taken over by the replica back first (the owner's heartbeat was as
    stale as everybody's): re-run there while the owner's own turn went on, and the
    owner's reply fenced, or, with its reply begun, the chat got the takeover's "restarted
    while my reply was being written" notice instead of the answer."""
    bot = bots[0]
    procs = start_replicas(tmp_path, ["r1", "r2"], dsn, model, [bot])
    paused = None
    try:
        owner = wait(lambda: owners(procs["r1"]).get("telegram:bot0"), timeout=30,
                     what="an owner")
        other = next(n for n in procs if n != owner)
        bot.call(bot.fake.inject_message, "warm up from u1 now", chat_id=9001, user_id=9001)
        wait(lambda: len(replies([bot])) == 1, timeout=30, what="the first answer")
        model.server.script_text("the answer of the live turn", delay=TTL + 4)
        bot.call(bot.fake.inject_message, "a slow question from u1 now", chat_id=9001,
                 user_id=9001)
        wait(lambda: len(model.server.requests) >= 2, timeout=20, what="the model call")
        pg.stop()
        paused = procs[owner].proc.pid
        os.kill(paused, signal.SIGSTOP)
        try:
            time.sleep(TTL + 0.5)  # every heartbeat is older than the lease TTL now
        finally:
            pg.start()
        wait(lambda: status(procs[other])["cluster"]["postgres"]["state"] == "up",
             timeout=20, what="the other replica back")
        time.sleep(1.0)  # the other replica runs its ticks; the owner is not back yet
        os.kill(paused, signal.SIGCONT)
        paused = None
        wait(lambda: len(replies([bot])) >= 2, timeout=30, what="the live turn's answer")
        time.sleep(1.0)  # a re-run's answer or a notice would show now
        assert Counter(replies([bot])) == {"echo: warm up from u1 now": 1,
                                           "the answer of the live turn": 1}
        assert _events(procs[other], "cluster_work_taken_over") == []
        assert owners(procs[other]).get("telegram:bot0") == owner  # the account stayed
    finally:
        if paused is not None:
            os.kill(paused, signal.SIGCONT)
        stop_all(procs)
