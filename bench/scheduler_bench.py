"""Scheduler benchmark: 10,000 cron jobs and 1,000 heartbeat agents.

Run: ``.venv/bin/python bench/scheduler_bench.py [--jobs 10000] [--agents 1000] [--hours 1]``

Reports (targets in brackets, DESIGN.md "Performance" / issue 4):

- ``next_fire`` cost per call, cold and warm (µs) and for all cron jobs [< 100 µs/call]
- ``CronService.start`` over a 10k-job store: time, tracemalloc and RSS delta [< 2 s, < 50 MB]
- one full ``jobs.json`` save (ms, size) and a simulated hour of runs on a FakeClock with a
  no-op execute (runs/s, including run-log appends and state saves)
- a heap of 1,000 heartbeat agents: memory and µs per beat (pop + reschedule)

Not a timed test: it prints figures. Uses a temp dir; touches nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import logging
import random
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.clock import FakeClock
from scheduler.cron import crontab
from scheduler.cron.job import new_job
from scheduler.cron.service import CronService, RunOutcome
from scheduler.cron.store import CronStore

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
TZS = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney",
       "America/Los_Angeles", "Europe/London", "Asia/Kolkata", "America/Sao_Paulo",
       "Australia/Lord_Howe", "Pacific/Auckland", "Africa/Cairo"]


def rss_kb() -> int:
    """Resident set size of this process (kB) from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def random_expr(rng: random.Random) -> str:
    m, h, d = rng.randrange(60), rng.randrange(24), rng.randrange(1, 29)
    return rng.choice([
        f"*/{rng.choice([1, 2, 5, 10, 15, 30])} * * * *",
        f"{m} {h} * * *",
        f"{m} {h} * * 1-5",
        f"{m} */{rng.choice([2, 3, 4, 6])} * * *",
        f"0 {h} {d} * *",
        f"{m} {h} {d} * 1",  # Vixie OR rule
        f"{m} {h} * {rng.choice(['JAN', 'mar-may', '*/3'])} *",
        "@hourly", "@daily", "@weekly", "@monthly",
        f"{m} {h} 29 2 *",
        f"30 {rng.choice([1, 2, 3])} * * *",  # DST-sensitive
    ])


def make_jobs(n: int, rng: random.Random) -> list:
    jobs = []
    for i in range(n):
        r = rng.random()
        if r < 0.6:
            sched = {"kind": "cron", "expr": random_expr(rng), "tz": rng.choice(TZS)}
        elif r < 0.9:
            sched = {"kind": "every", "interval": rng.choice([60, 300, 900, 1800, 3600, 86400])}
        else:
            sched = {"kind": "at", "at": T0 + rng.randrange(60, 7 * 86400)}
        jobs.append(new_job(name=f"job-{i}", schedule=sched, message=f"task {i}", now=T0,
                            session_target=rng.choice(["main", "isolated"])))
    return jobs


def bench_next_fire(jobs: list) -> None:
    cron = [j.schedule for j in jobs if j.schedule["kind"] == "cron"]
    crontab.parse.cache_clear()
    t = time.perf_counter()
    for s in cron:
        crontab.parse(s["expr"])
    parse_us = (time.perf_counter() - t) / len(cron) * 1e6
    t = time.perf_counter()
    for s in cron:
        crontab.next_fire(s["expr"], T0, s["tz"])
    total = time.perf_counter() - t
    chained, t = 0, time.perf_counter()
    for s in cron[:500]:  # follow each schedule 20 firings ahead
        at = T0
        for _ in range(20):
            at = crontab.next_fire(s["expr"], at, s["tz"])
            chained += 1
    chain_us = (time.perf_counter() - t) / chained * 1e6
    print(f"cron jobs: {len(cron)}; parse {parse_us:.1f} µs/expr (uncached)")
    print(f"next_fire for every cron job: total {total * 1000:.1f} ms, "
          f"{total / len(cron) * 1e6:.1f} µs/call")
    print(f"next_fire chained 20 ahead x 500 jobs: {chain_us:.1f} µs/call")


async def bench_service(jobs: list, hours: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = CronStore(Path(tmp) / "cron" / "jobs.json")
        t = time.perf_counter()
        store.save(jobs)
        save_ms = (time.perf_counter() - t) * 1000
        size_kb = store.path.stat().st_size / 1024
        print(f"jobs.json save (all {len(jobs)} jobs encoded): {save_ms:.1f} ms, "
              f"{size_kb:.0f} kB")
        del jobs
        pristine = store.path.read_bytes()  # no next_run_at yet: start computes them all
        runs = 0

        async def execute(job) -> RunOutcome:
            nonlocal runs
            runs += 1
            return RunOutcome("ok")

        t = time.perf_counter()
        svc = CronService(store, FakeClock(T0), execute)
        await svc.start()
        print(f"CronService.start with {svc.status()['jobs']} jobs: "
              f"{(time.perf_counter() - t) * 1000:.0f} ms (load, validate, next runs, heap, save)")
        await svc.stop()
        del svc
        store.path.write_bytes(pristine)
        gc.collect()

        clock = FakeClock(T0)
        rss0 = rss_kb()
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
        t = time.perf_counter()
        svc = CronService(store, clock, execute)
        await svc.start()
        start_s = time.perf_counter() - t
        gc.collect()
        peak = tracemalloc.get_traced_memory()[1]
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
        rss1 = rss_kb()
        st = svc.status()
        print(f"  same under tracemalloc: {start_s * 1000:.0f} ms; scheduling memory: "
              f"tracemalloc +{grown / 1e6:.1f} MB "
              f"({grown / st['jobs']:.0f} B/job), peak {peak / 1e6:.1f} MB; "
              f"RSS +{(rss1 - rss0) / 1024:.1f} MB")

        t = time.perf_counter()
        store.save(list(svc._jobs.values()), changed=set())
        print(f"jobs.json save, nothing re-encoded: {(time.perf_counter() - t) * 1000:.1f} ms")

        t = time.perf_counter()
        await clock.advance(hours * 3600)
        sim = time.perf_counter() - t
        print(f"simulated {hours:g} h on FakeClock: {runs} runs in {sim:.2f} s wall "
              f"({runs / sim:.0f} runs/s incl. run-log appends and jobs.json saves)")
        await svc.stop()


def bench_heartbeats(agents: int) -> None:
    rng = random.Random(7)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    every = {f"agent-{i}": rng.choice([900.0, 1800.0, 3600.0]) for i in range(agents)}
    heap = [(T0 + rng.uniform(0, iv), name) for name, iv in every.items()]
    heapq.heapify(heap)
    mem = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    beats, t = 0, time.perf_counter()
    horizon = T0 + 86400
    while heap[0][0] < horizon:
        due, name = heapq.heappop(heap)
        heapq.heappush(heap, (due + every[name], name))
        beats += 1
    dt = time.perf_counter() - t
    print(f"heartbeat heap, {agents} agents: {mem / 1024:.0f} kB tracemalloc; "
          f"{beats} beats over 24 h simulated in {dt * 1000:.1f} ms "
          f"({dt / beats * 1e6:.2f} µs/beat pop+push)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--agents", type=int, default=1_000)
    ap.add_argument("--hours", type=float, default=1.0)
    args = ap.parse_args()
    # measure the scheduler, not console logging of 50k runs
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    rng = random.Random(42)
    jobs = make_jobs(args.jobs, rng)
    print(f"python {sys.version.split()[0]}; {args.jobs} jobs "
          f"(60% cron / 30% every / 10% at, {len(TZS)} time zones)")
    bench_next_fire(jobs)
    asyncio.run(bench_service(jobs, args.hours))
    bench_heartbeats(args.agents)


if __name__ == "__main__":
    main()
