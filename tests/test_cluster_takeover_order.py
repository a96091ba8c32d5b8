"""A takeover keeps a session's order (gateway/cluster/adopt.py): three real replicas on a
real PostgreSQL, six Telegram chats, kill -9 of the account owner while the second
message of every chat is mid-turn, the third sent right after, the killed replica
restarted at once (as its service manager does, well within the lease TTL). Every
message gets exactly one reply, in the order the messages were sent."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import cluster_harness
from tests import test_cluster_replicas as replicas
from tests.cluster_harness import wait
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import GatewayProcess
from tests.test_cluster_replicas import owners, replica_config, replies, stop_all

pytestmark = [pytest.mark.timeout(200),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

pg, dsn = cluster_harness.pg, cluster_harness.dsn  # fixtures
bots = replicas.bots  # fixture
CHATS = [9101 + i for i in range(6)]
TTL = 10.0  # cluster.lease_ttl: the restarted replica is back well within it


@pytest.fixture
def slow_model():
    m = FakeOpenAI.start_in_thread(latency=0.8)  # a kill lands mid-turn
    yield m
    m.stop()


def start_replicas(tmp, names, dsn, model, bots) -> dict[str, GatewayProcess]:
    procs = {}
    for n in names:
        (tmp / n).mkdir(parents=True, exist_ok=True)
        cfg = replica_config(tmp, n, dsn, model, bots)
        cfg["cluster"]["lease_ttl"] = f"{TTL}s"
        procs[n] = GatewayProcess(tmp / n, cfg)
    with ThreadPoolExecutor(len(procs)) as pool:  # started at once
        list(pool.map(lambda p: p.start(timeout=40), procs.values()))
    return procs


def _send(bot, k: int) -> None:
    bot.call(lambda f=bot.fake: [f.inject_message(f"m{k} of chat {c} now", chat_id=c,
                                                  user_id=c) for c in CHATS])


def test_kill9_of_the_owner_mid_turn_answers_every_message_once_in_order(tmp_path, dsn,
                                                                           slow_model, bots):
    """It ended ``[m0, m2, m2]`` in the chats: the restarted replica (its rows orphaned,
    its leases given up by its rejoin) took the account back and received the third
    message, which took the free lane and ran at once; the interrupted second turn, taken
    over a tick later, was re-run after it on a transcript already ending with the third
    message, so it answered that one again and the second never."""
    bot = bots[0]
    procs = start_replicas(tmp_path, ["r1", "r2", "r3"], dsn, slow_model, [bot])
    try:
        owner = wait(lambda: owners(procs["r1"]).get("telegram:bot0"), timeout=30,
                     what="an owner")
        _send(bot, 0)
        wait(lambda: len(replies([bot])) >= len(CHATS), timeout=30, what="the m0 answers")
        _send(bot, 1)
        wait(lambda: len(slow_model.server.requests) >= 2 * len(CHATS), timeout=20,
             what="the m1 turns' model calls")
        procs[owner].kill9()
        _send(bot, 2)
        procs[owner].start(timeout=40)  # restarted at once: the same replica id
        total = 3 * len(CHATS)
        wait(lambda: len(replies([bot])) >= total, timeout=60, what="every answer")
        time.sleep(1.0)  # a late duplicate would show now
        got = {c: [m["text"] for m in bot.call(bot.fake.bot_messages, c)] for c in CHATS}
        counts = Counter(got[c].count(f"echo: m{k} of chat {c} now")
                         for c in CHATS for k in range(3))
        assert counts == {1: total}, f"answered n times: {dict(counts)}; {got}"
        for c in CHATS:  # in the order they were sent
            assert got[c] == [f"echo: m{k} of chat {c} now" for k in range(3)]
    finally:
        stop_all(procs)
