"""Channel accounts spread across live replicas (README "Replicas"): three Telegram
accounts on three real ``tidegate gateway`` replicas over a real PostgreSQL run one per
replica, also when one replica came up first and took them all; a kill -9 moves the dead
replica's account to a survivor; the replica back rebalances them — with messages
arriving all the while, every one answered exactly once, and never two pollers on one
token at once (the fake Bot API notes every getUpdates that overlaps another client's)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import cluster_harness
from tests.cluster_harness import wait
from tests.fakes import fake_telegram
from tests.helpers import GatewayProcess
from tests.test_cluster_replicas import (
    TimedModel,
    owners,
    replica_config,
    replies,
    stop_all,
)

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

pg, dsn = cluster_harness.pg, cluster_harness.dsn  # fixtures


@pytest.fixture
def bots():
    fakes = [fake_telegram.start_in_thread(token=f"10{i}:TEST-bot-{i}", bot_id=7_000_000_100 + i,
                                           bot_username=f"tidegate_bot_{i}") for i in range(3)]
    yield fakes
    for f in fakes:
        f.stop()


@pytest.fixture
def model():
    m = TimedModel.start_in_thread(latency=0.02)
    yield m
    m.stop()


class Sender:
    """Injects a message into every bot every ``every`` seconds (a fresh chat per bot,
    user ids 8000 + bot * 1000 + n % 10) until stopped; appends the texts to ``sent``."""

    def __init__(self, bots, sent: list[str], every: float = 0.4) -> None:
        self.bots, self.every, self.sent = bots, every, sent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = len(self.sent)
        while not self._stop.is_set():
            for i, b in enumerate(self.bots):
                chat = 8000 + i * 1000 + n % 10
                text = f"hello from u{chat} m{n}"
                b.call(b.fake.inject_message, text, chat_id=chat, user_id=chat)
                self.sent.append(text)
            n += 1
            self._stop.wait(self.every)

    def __enter__(self) -> Sender:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def spread(gp: GatewayProcess, live: set[str]) -> dict[str, str] | None:
    """account -> replica when each of ``live`` runs exactly one account."""
    o = owners(gp)
    return o if len(o) == 3 and set(o.values()) == live else None


def test_accounts_spread_move_to_survivors_and_rebalance_without_two_pollers(
        tmp_path, dsn, model, bots):
    names = ["r1", "r2", "r3"]
    procs = {}
    for n in names:
        (tmp_path / n).mkdir()
        procs[n] = GatewayProcess(tmp_path / n, replica_config(tmp_path, n, dsn, model, bots))
    sent: list[str] = []

    def all_answered() -> None:
        wait(lambda: len(replies(bots)) >= len(sent), timeout=60, what="every reply")

    try:
        procs["r1"].start(timeout=40)  # alone: it takes every account
        wait(lambda: len(owners(procs["r1"])) == 3, timeout=20, what="r1 owns all")
        with Sender(bots, sent):  # accounts handed over while messages arrive
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda n: procs[n].start(timeout=40), ["r2", "r3"]))
            got = wait(lambda: spread(procs["r1"], set(names)), timeout=30,
                       what="one account per replica")
        all_answered()
        victim = got["telegram:bot0"]
        procs[victim].kill9()  # between turns: what a kill mid-turn does is takeover's
        alive = set(names) - {victim}
        probe = procs[min(alive)]
        with Sender(bots, sent):  # bot0's messages wait for its next owner
            moved = wait(lambda: (o := owners(probe)) and len(o) == 3 and
                         set(o.values()) == alive and o, timeout=30,
                         what="the dead replica's account on a survivor")
            assert moved["telegram:bot0"] in alive
            procs[victim].start(timeout=40)  # back, same replica id
            wait(lambda: spread(probe, set(names)), timeout=30, what="rebalanced")
            time.sleep(0.5)
        all_answered()
        time.sleep(1.0)  # a late duplicate would show now
        assert Counter(replies(bots)) == Counter(f"echo: {t}" for t in sent)
        for b in bots:  # never two pollers on one token at once
            assert b.call(lambda f=b.fake: list(f.poll_overlaps)) == []
        conflicts = [x for p in procs.values() for x in p.log_lines()
                     if x.get("error_type") == "Conflict"]
        assert conflicts == []
        released = [x for p in procs.values() for x in p.log_lines()
                    if x.get("event") == "cluster_account_released"]
        assert len(released) >= 3  # r1 gave two back at the start, one after the return
    finally:
        stop_all(procs)
