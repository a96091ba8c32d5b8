"""Replicas benchmark (issue 15 "Benchmarks"): one gateway on embedded storage, then 1, 2
and 3 ``tidegate gateway`` replicas on one real PostgreSQL (started here in a temp dir),
three fake Telegram bot accounts (in this process, on 127.0.0.1) spread over the replicas,
100 sessions (users).

    .venv/bin/python bench/cluster_bench.py [--replicas 0,1,2,3] [--sessions 100]
        [--messages 3] [--model-delay-ms 0,50] [--rounds 1] [--no-takeover]
        [--takeover-ttl 15]
    .venv/bin/python bench/cluster_bench.py --replicas 1,3 --model-delay-ms 50 --rounds 2 \
        --no-takeover        # the 3-vs-1 scaling figure

Cases: for every replica count and model delay, every session sends ``--messages``
messages (the next one when the reply to the previous arrived: closed loop, 100
concurrent sessions). turns/s = replies ÷ wall time of the phase; gateway overhead per
turn = reply received by the fake platform − message injected − the model's delay (p50 and
p99). Delay 0 is the built-in echo model (no model server); delay 50 is the fake OpenAI
server answering after 50 ms. Then the takeover: kill -9 of the replica owning the account,
time from the kill to the reply of a message sent right after it (default lease_ttl 15 s).
Targets (issue 15, 23): one replica on PostgreSQL >= 50 % of embedded turns/s; two
replicas >= 1.6x one replica and three >= 2.4x one with a 50 ms model, measured side by
side in one run (``--rounds N`` alternates the cases N times and compares medians);
takeover <= 20 s. The machine is shared: compare
the load average printed. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cluster_harness import database_of, start_private_server, wait
from tests.fakes import fake_telegram
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import GatewayProcess, base_config

TTL = 5.0  # cluster.lease_ttl for the bench


def replica_config(tmp: Path, name: str, dsn: str | None, model_url: str | None,
                   bots, ttl: float = TTL) -> dict:
    accounts = {f"bot{i}": {"token": b.fake.token, "api_base_url": f"{b.url}/bot",
                            "poll_timeout": 1, "dm_policy": "open"}
                for i, b in enumerate(bots)}
    cfg = base_config(tmp / name / "state", model_url,
                      channels={"telegram": {"enabled": True, "accounts": accounts}},
                      storage={"backend": "postgres", "dsn": dsn} if dsn else {},
                      cluster={"lease_ttl": f"{ttl}s", "replica_id": name},
                      logging={"level": "warning"})
    cfg["cron"] = {"enabled": False}
    cfg["gateway"]["journal_fsync"] = False
    return cfg


def start(tmp: Path, n: int, dsn: str | None, model_url: str | None, bots,
          ttl: float = TTL) -> list[GatewayProcess]:
    procs = []
    for i in range(n):
        d = tmp / f"r{i + 1}"
        d.mkdir(parents=True, exist_ok=True)
        procs.append(GatewayProcess(d, replica_config(tmp, f"r{i + 1}", dsn, model_url, bots,
                                                      ttl)))
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda p: p.start(timeout=60), procs))
    return procs


def owned(pg: Any, dsn: str) -> dict[str, str]:
    rows = pg.psql("SELECT name || '|' || replica_id FROM cluster_leases WHERE name LIKE "
                   "'account:%'", database_of(dsn))
    return dict(line.split("|", 1) for line in rows.splitlines() if "|" in line)


class Load:
    """Closed-loop sessions: each user sends its next message when its reply arrived. The
    users of one bot run as tasks on that fake's own event loop (no cross-thread polling
    that would load this process)."""

    def __init__(self, bots, sessions: int, messages: int, base: int) -> None:
        self.bots, self.sessions, self.messages = bots, sessions, messages
        self.base = base  # first chat id: every case talks in fresh chats
        self.latencies: list[float] = []

    def run(self) -> float:
        t0 = time.monotonic()
        futures = []
        for i, bot in enumerate(self.bots):
            chats = [self.base + u for u in range(self.sessions) if u % len(self.bots) == i]
            futures.append(asyncio.run_coroutine_threadsafe(self._drive(bot.fake, chats),
                                                            bot._loop))
        for f in futures:
            self.latencies += f.result(timeout=600)
        return time.monotonic() - t0

    async def _drive(self, fake, chats: list[int]) -> list[float]:
        out: list[float] = []

        async def user(chat: int) -> None:
            for k in range(self.messages):
                sent = time.monotonic()
                fake.inject_message(f"m{k} from {chat}", chat_id=chat, user_id=chat)
                while len(fake.bot_messages(chat)) <= k:
                    if time.monotonic() - sent > 120:
                        raise TimeoutError(f"no reply in chat {chat}")
                    await asyncio.sleep(0.002)
                out.append(time.monotonic() - sent)

        await asyncio.gather(*(user(c) for c in chats))
        return out


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] if values else float("nan")


def case(tmp: Path, pg: Any, n: int, delay_ms: int, args, bots, rnd: int = 0) -> float:
    """``n`` replicas on PostgreSQL; ``n`` = 0: one gateway on embedded storage."""
    dsn = pg.create_database() if n else None
    model = FakeOpenAI.start_in_thread(latency=delay_ms / 1000) if delay_ms else None
    procs = start(tmp / f"c{n}-{delay_ms}-{rnd}", max(1, n), dsn, model.base_url if model else None,
                  bots)
    try:
        if dsn:
            wait(lambda: len(set(owned(pg, dsn).values())) == min(n, len(bots)),
                 timeout=60, what="accounts spread")
        load = Load(bots, args.sessions, args.messages,
                    base=100_000 * (1 + n + 10 * delay_ms) + 10_000 * rnd)
        took = load.run()
        turns = len(load.latencies)
        over = [(x - delay_ms / 1000) * 1000 for x in load.latencies]
        rate = turns / took
        label = f"replicas={n} postgres" if n else "embedded (1 gateway)"
        print(f"{label} model={delay_ms}ms turns={turns} turns/s={rate:.1f} "
              f"overhead p50={pct(over, 0.5):.1f}ms p99={pct(over, 0.99):.1f}ms")
        return rate
    finally:
        for p in procs:
            p.stop()
        if model:
            model.stop()


def takeover(tmp: Path, pg: Any, bots, ttl: float) -> float:
    dsn = pg.create_database()
    procs = start(tmp / "takeover", 2, dsn, None, bots[:1], ttl)
    try:
        owner = wait(lambda: owned(pg, dsn).get("account:telegram:bot0"), timeout=60,
                     what="an owner")
        victim = next(p for p in procs if p.state_dir.parent.name == owner)
        bot = bots[0]
        before = len(bot.call(bot.fake.bot_messages, 777))
        victim.kill9()
        killed = time.monotonic()
        bot.call(bot.fake.inject_message, "after the kill", chat_id=777, user_id=777)
        wait(lambda: len(bot.call(bot.fake.bot_messages, 777)) > before, timeout=120,
             what="the reply after takeover")
        return time.monotonic() - killed
    finally:
        for p in procs:
            if p.proc and p.proc.poll() is None:
                p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="0,1,2,3", help="0 = one gateway, embedded")
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--messages", type=int, default=3)
    ap.add_argument("--model-delay-ms", default="0,50")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the cases alternately; figures are medians")
    ap.add_argument("--no-takeover", action="store_true")
    ap.add_argument("--takeover-ttl", type=float, default=15.0,
                    help="cluster.lease_ttl of the takeover case (default: the default)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tidegate-cluster-bench-"))
    pg = start_private_server()
    bots = [fake_telegram.start_in_thread(token=f"20{i}:BENCH-{i}", bot_id=7_100_000_000 + i,
                                          bot_username=f"bench_bot_{i}") for i in range(3)]
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores; lease_ttl {TTL}s "
          "(throughput cases)")
    rates: dict[tuple[int, int], float] = {}
    try:
        samples: dict[tuple[int, int], list[float]] = {}
        for r in range(args.rounds):  # rounds alternate the cases: load drift hits all
            for delay in [int(x) for x in args.model_delay_ms.split(",")]:
                for n in [int(x) for x in args.replicas.split(",")]:
                    samples.setdefault((n, delay), []).append(
                        case(tmp, pg, n, delay, args, bots, r))
        rates = {k: statistics.median(v) for k, v in samples.items()}
        if args.rounds > 1:
            for (n, delay), v in sorted(samples.items()):
                print(f"replicas={n} model={delay}ms turns/s median {rates[(n, delay)]:.1f} "
                      f"(rounds: {', '.join(f'{x:.1f}' for x in v)})")
        for delay in {d for _, d in rates}:
            if (0, delay) in rates and (1, delay) in rates:
                share = rates[(1, delay)] / rates[(0, delay)]
                print(f"one replica on PostgreSQL / embedded, {delay} ms model: {share:.2f}x "
                      f"(target >= 0.5x: {'PASS' if share >= 0.5 else 'FAIL'})")
        for n, target in ((2, 1.6), (3, 2.4)):
            if (1, 50) in rates and (n, 50) in rates:
                ratio = rates[(n, 50)] / rates[(1, 50)]
                print(f"{n} replicas / one with a 50 ms model: {ratio:.2f}x "
                      f"(target >= {target}x: {'PASS' if ratio >= target else 'FAIL'})")
        if not args.no_takeover:
            took = takeover(tmp, pg, bots, args.takeover_ttl)
            print(f"takeover after kill -9 (lease_ttl {args.takeover_ttl:g}s): {took:.1f}s "
                  f"(target <= 20 s: {'PASS' if took <= 20 else 'FAIL'})")
    finally:
        for b in bots:
            b.stop()
        pg.destroy()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
