"""Timeline benchmark: append latency/throughput at 100 concurrent sessions, verify speed.

Run: ``.venv/bin/python bench/timeline_bench.py [--sessions 100] [--events 100]
[--rate 5000] [--seconds 3] [--verify-events 1000000] [--db-dir DIR]``

Targets (issue 5): append p99 <= 5 ms and >= 5,000 events/s with 100 concurrent sessions;
``verify`` over 1,000,000 events reports events/s. Three measurements:

1. closed loop: every session appends its next event as soon as the previous one
   returns (maximum throughput; latency = concurrency / throughput by Little's law);
2. open loop: the sessions together offer ``--rate`` events/s (each session on its own
   fixed schedule) for ``--seconds``; this is the latency at the target load;
3. verify: bulk-load ``--verify-events`` valid events (1,000 per session, written
   straight into the schema with the same hash function), then time ``Timeline.verify()``.

This is a script, not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import structlog

from runtime.timeline import Timeline
from runtime.timeline.model import GENESIS_HASH, canonical_content, event_hash_raw
from runtime.timeline.store import SqliteTimelineStore

P99_TARGET_MS = 5.0
RATE_TARGET = 5_000


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def _content(i: int) -> dict:
    return {"text": f"message {i}: the quick brown fox jumps over the lazy dog", "sender": "u1"}


async def closed_loop(tl: Timeline, sessions: int, events: int) -> tuple[list[float], float]:
    await asyncio.gather(*(tl.init_timeline(f"closed-{s}", f"agent:main:bench:{s}")
                           for s in range(sessions)))
    lat: list[float] = []

    async def one(s: int) -> None:
        for i in range(events):
            t0 = time.perf_counter()
            await tl.append_event(f"closed-{s}", "USER_INPUT", _content(i))
            lat.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(s) for s in range(sessions)))
    return lat, time.perf_counter() - t0


async def open_loop(tl: Timeline, sessions: int, rate: float, seconds: float
                    ) -> tuple[list[float], float, int]:
    await asyncio.gather(*(tl.init_timeline(f"open-{s}", f"agent:main:open:{s}")
                           for s in range(sessions)))
    period = sessions / rate  # seconds between two appends of one session
    lat: list[float] = []
    late = 0
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05

    async def one(s: int) -> None:
        nonlocal late
        i = 0
        due = start + period * s / sessions  # stagger sessions evenly over one period
        while due < start + seconds:
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -period:
                late += 1
            t0 = time.perf_counter()
            await tl.append_event(f"open-{s}", "USER_INPUT", _content(i))
            lat.append((time.perf_counter() - t0) * 1000)
            i += 1
            due += period

    t0 = time.perf_counter()
    await asyncio.gather(*(one(s) for s in range(sessions)))
    return lat, time.perf_counter() - t0, late


def bulk_load(path: str, total: int, per_session: int = 1000) -> None:
    """Write ``total`` valid chained events straight into the schema (setup only)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=OFF")  # setup speed only; the store reopens it in WAL
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-262144")  # 256 MB: the random uuid PK index stays cached
    base = 1_767_225_600_000
    done, s = 0, 0
    conn.execute("BEGIN")
    while done < total:
        sid = f"verify-{s:06d}"
        key = f"agent:main:verify:{s}"  # SESSION_CREATE and the timelines row must agree
        n = min(per_session, total - done)
        rows, prev, ts = [], GENESIS_HASH, base + s
        for seq in range(1, n + 1):
            etype = "SESSION_CREATE" if seq == 1 else "USER_INPUT"
            content = canonical_content({"session_key": key} if seq == 1 else _content(seq))
            eid = str(uuid.uuid4())
            h = event_hash_raw(eid, sid, seq, ts, etype, content, prev)
            rows.append((eid, sid, seq, ts, etype, content, prev, h))
            prev, ts = h, ts + 7
        conn.execute("INSERT INTO timelines VALUES (?, ?, 'active', ?, NULL, ?, ?, ?)",
                     (sid, key, base + s, n, prev, ts - 7))
        conn.executemany("INSERT INTO timeline_events VALUES (?,?,?,?,?,?,?,?)", rows)
        done += n
        s += 1
        if s % 200 == 0:
            conn.execute("COMMIT")
            conn.execute("BEGIN")
    conn.execute("COMMIT")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()


def _remove_db(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(path + suffix).unlink(missing_ok=True)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--events", type=int, default=100, help="events per session (closed loop)")
    ap.add_argument("--rate", type=float, default=float(RATE_TARGET),
                    help="offered events/s (open loop)")
    ap.add_argument("--seconds", type=float, default=3.0, help="open-loop duration")
    ap.add_argument("--verify-events", type=int, default=1_000_000)
    ap.add_argument("--db-dir", default=None,
                    help="keep the databases here (default: a temp dir, removed afterwards)")
    ap.add_argument("--switch-interval", type=float, default=0.001,
                    help="sys.setswitchinterval, as the gateway sets it (Python default 0.005)")
    args = ap.parse_args()
    sys.setswitchinterval(args.switch_interval)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    tmp = args.db_dir or tempfile.mkdtemp(prefix="timeline-bench-")
    try:
        await run(args, tmp)
    finally:
        if args.db_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)


async def run(args: argparse.Namespace, tmp: str) -> None:
    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
          f"sqlite {sqlite3.sqlite_version}; db dir {tmp}")

    apath = os.path.join(tmp, "append.db")
    _remove_db(apath)
    tl = await Timeline.open_sqlite(apath)
    lat, wall = await closed_loop(tl, args.sessions, args.events)
    n = len(lat)
    print(f"\n[closed loop] {args.sessions} sessions x {args.events} appends = {n} events "
          f"in {wall:.2f} s")
    print(f"  throughput {n / wall:,.0f} events/s (target >= {RATE_TARGET:,}) "
          f"{verdict(n / wall >= RATE_TARGET)}")
    print(f"  latency p50 {_pct(lat, 50):.2f} ms  p99 {_pct(lat, 99):.2f} ms  "
          f"max {max(lat):.2f} ms  (bounded below by {args.sessions} in flight / throughput)")

    lat, wall, late = await open_loop(tl, args.sessions, args.rate, args.seconds)
    n = len(lat)
    p99 = _pct(lat, 99)
    print(f"\n[open loop] {args.sessions} sessions offering {args.rate:,.0f} events/s for "
          f"{args.seconds:g} s: {n} events in {wall:.2f} s = {n / wall:,.0f} events/s"
          f"{f' ({late} sends ran late)' if late else ''}")
    print(f"  latency p50 {_pct(lat, 50):.2f} ms  p99 {p99:.2f} ms (target <= {P99_TARGET_MS} ms) "
          f"{verdict(p99 <= P99_TARGET_MS)}  mean {statistics.fmean(lat):.2f} ms  "
          f"max {max(lat):.2f} ms")
    report = await tl.verify()
    print(f"  chains after the run: {report}")
    await tl.close()

    if args.verify_events > 0:
        vpath = os.path.join(tmp, "verify.db")
        _remove_db(vpath)
        await SqliteTimelineStore.open(vpath).close()  # creates the schema
        t0 = time.perf_counter()
        bulk_load(vpath, args.verify_events)
        load = time.perf_counter() - t0
        tl = await Timeline.open_sqlite(vpath)
        t0 = time.perf_counter()
        report = await tl.verify()
        took = time.perf_counter() - t0
        await tl.close()
        size = os.path.getsize(vpath) / 1e6
        print(f"\n[verify] {report.events_checked:,} events in {report.sessions_checked:,} "
              f"sessions ({size:,.0f} MB, loaded in {load:.1f} s): verify took {took:.2f} s = "
              f"{report.events_checked / took:,.0f} events/s, ok={report.ok}")


if __name__ == "__main__":
    asyncio.run(main())
