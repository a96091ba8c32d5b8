"""Storage benchmark (issue 15 "Benchmarks"): the PostgreSQL backend against embedded.

Run: ``.venv/bin/python bench/storage_bench.py [--sessions 100] [--turns-per-session 10]
[--appends 20] [--dsn postgresql://...]``

Without ``--dsn`` it starts a throwaway PostgreSQL like the tests do (``tests/pg_server.py``:
initdb in a temp dir, fsync off — so the figures show tidegate's cost over PostgreSQL,
not the disk's; ``--durable`` keeps fsync and synchronous_commit on, so every commit
waits for the WAL flush; with ``--dsn`` they show your server). Prints, with targets:

- timeline append latency on PostgreSQL: 1, 10 and ``--sessions`` concurrent sessions
  (closed loop), each appending one turn's events (USER_INPUT, LLM_RESPONSE, TOOL_CALL:
  one ``append_events`` = one transaction) ``--appends`` times; p50/p99 per call and
  events/s, the median of ``--repeat`` runs, and how many appends one group commit round
  carried; the same on SQLite for comparison. Target: p99 <= 5 ms for one append (one
  session appending; with many sessions a call also waits for the round in flight, which
  carries everyone's appends, so that p99 is about two rounds).
- one gateway replica, in process, the zero-latency ``echo`` model, ``--sessions``
  closed-loop sessions (``bench/gateway_bench.py``'s driver): turns/s and gateway
  overhead p50/p99 on embedded storage and on PostgreSQL [PostgreSQL >= 50 % of
  embedded turns/s]. The timeline backlog is drained before the clock stops.
A script that prints figures, not a timed test. Several replicas: see bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway_bench import drive
from gateway_bench_common import bench_config, pct

from gateway.config.load import parse_config
from gateway.logs.pipeline import configure_logging, reset_logging
from gateway.service.daemon import Gateway
from runtime.clock import SYSTEM_CLOCK
from runtime.storage.config import StorageSection
from runtime.storage.postgres.pool import open_database
from runtime.timeline import Timeline

QUIET = open(os.devnull, "w")  # the log stream, for the process's life
TURN = [("USER_INPUT", {"text": "hello there, what is on my calendar today?"}, None),
        ("LLM_RESPONSE", {"text": "Let me check.", "tool_calls": [{"id": "c1"}]}, None),
        ("TOOL_CALL", {"id": "c1", "name": "calendar", "arguments": {"day": "today"}}, None)]


async def timeline_appends(tl: Timeline, sessions: int, appends: int, tag: str = "bench"
                           ) -> dict[str, float]:
    lat: list[float] = []
    batcher = getattr(tl.store, "batcher", None)
    rounds0 = batcher.rounds if batcher is not None else 0

    async def one(i: int) -> None:
        sid = f"{tag}-{i}"
        await tl.init_timeline(sid, f"agent:main:bench:dm:{i}")
        for _ in range(appends):
            t0 = time.perf_counter()
            res = await tl.append_events(sid, TURN)
            lat.append((time.perf_counter() - t0) * 1000)
            if any(isinstance(r, BaseException) for r in res):
                raise RuntimeError(f"append failed: {res}")
    w0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(sessions)))
    wall = time.perf_counter() - w0
    report = await tl.verify()
    assert report.ok, report
    rounds = (batcher.rounds - rounds0) if batcher is not None else 0
    return {"p50": pct(lat, 50), "p99": pct(lat, 99),
            "events_s": len(lat) * len(TURN) / wall,
            "per_round": (len(lat) + sessions) / rounds if rounds else 0.0}


async def timeline_matrix(tl: Timeline, args: argparse.Namespace) -> dict[int, dict]:
    """The median (by p99) of ``--repeat`` runs at 1, 10 and ``--sessions`` sessions."""
    out: dict[int, dict] = {}
    for n in sorted({1, 10, args.sessions}):
        runs = [await timeline_appends(tl, n, args.appends, f"r{r}n{n}")
                for r in range(args.repeat)]
        out[n] = sorted(runs, key=lambda r: r["p99"])[len(runs) // 2]
    return out


def timeline_lines(label: str, figures: dict[int, dict]) -> None:
    for n, f in figures.items():
        target, verdict = ("p99 <= 5 ms", "PASS" if f["p99"] <= 5 else "FAIL") \
            if n == 1 and label == "PostgreSQL" else ("", "")
        rounds = f"  ({f['per_round']:.0f} appends/round)" if f["per_round"] else ""
        line(f"{label}, {n} session{'s' if n > 1 else ''}: p50 / p99",
             f"{f['p50']:.2f} / {f['p99']:.2f} ms", target, verdict)
        line(f"  events/s{rounds}", f"{f['events_s']:,.0f}")


async def gateway_run(state: Path, storage: dict[str, Any], args: argparse.Namespace
                      ) -> dict[str, float]:
    opts = SimpleNamespace(log_level="warning", cap=None, timeline="on")
    cfg = bench_config(state, opts)
    cfg["storage"] = storage
    loaded = parse_config(cfg, "bench", env={})
    configure_logging(state_dir=state, level="warning", fmt="json", stream=QUIET)
    gw = Gateway(loaded)
    try:
        await gw.start()
        await drive(gw, min(args.sessions, 10), 3, "warm")
        await gw.timeline_hooks.flush()
        samples, wall = await drive(gw, args.sessions, args.turns_per_session, "u")
        t = time.perf_counter()
        await gw.timeline_hooks.flush()
        wall += time.perf_counter() - t
    finally:
        await gw.stop()
        reset_logging()
    over = [s.overhead_ms for s in samples]
    return {"turns_s": len(samples) / wall, "p50": pct(over, 50), "p99": pct(over, 99)}


def line(label: str, value: str, target: str = "", verdict: str = "") -> None:
    print(f"  {label:<44} {value:>22}  {target:<18} {verdict}")


async def main_async(args: argparse.Namespace, dsn_for: Any) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="tidegate-storage-bench-"))
    configure_logging(state_dir=None, level="warning", stream=QUIET)
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores shared; run it a few "
          "times)")
    pool = await open_database(StorageSection(backend="postgres", dsn=dsn_for(),
                                              pool={"min": 4, "max": 10}))
    pg_tl = await Timeline.open_postgres(pool, SYSTEM_CLOCK)
    try:
        pg = await timeline_matrix(pg_tl, args)
    finally:
        await pg_tl.close()
        await pool.close()
    sq_tl = await Timeline.open_sqlite(tmp / "timeline.db", SYSTEM_CLOCK)
    try:
        sq = await timeline_matrix(sq_tl, args)
    finally:
        await sq_tl.close()
    print(f"timeline append_events (one turn = {len(TURN)} events = one call, closed loop, "
          f"median of {args.repeat} runs; PostgreSQL "
          f"{'durable: fsync + synchronous_commit on' if args.durable else 'fsync off'}):")
    timeline_lines("PostgreSQL", pg)
    timeline_lines("SQLite (comparison)", sq)
    print(f"load average after the timeline runs: {os.getloadavg()[0]:.2f}")
    if args.timeline_only:
        return 0

    emb = await gateway_run(tmp / "embedded", {"backend": "embedded"}, args)
    pgr = await gateway_run(tmp / "postgres", {"backend": "postgres", "dsn": dsn_for(),
                                               "pool": {"min": 2, "max": 10}}, args)
    ratio = pgr["turns_s"] / emb["turns_s"]
    print(f"one gateway replica, echo model, {args.sessions} sessions x "
          f"{args.turns_per_session} turns:")
    line("embedded turns/s", f"{emb['turns_s']:,.0f}")
    line("embedded overhead p50 / p99", f"{emb['p50']:.2f} / {emb['p99']:.2f} ms")
    line("PostgreSQL turns/s", f"{pgr['turns_s']:,.0f}", ">= 50% of embedded",
         f"{ratio:.0%} {'PASS' if ratio >= 0.5 else 'FAIL'}")
    line("PostgreSQL overhead p50 / p99", f"{pgr['p50']:.2f} / {pgr['p99']:.2f} ms")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--turns-per-session", type=int, default=10)
    ap.add_argument("--appends", type=int, default=20, help="turns appended per session")
    ap.add_argument("--repeat", type=int, default=3, help="runs per timeline figure")
    ap.add_argument("--timeline-only", action="store_true",
                    help="only the timeline append figures")
    ap.add_argument("--durable", action="store_true",
                    help="the throwaway server keeps fsync and synchronous_commit on")
    ap.add_argument("--dsn", help="an existing PostgreSQL database (default: a throwaway "
                                  "server in a temp dir)")
    args = ap.parse_args()
    if args.dsn:
        return asyncio.run(main_async(args, lambda: args.dsn))
    from tests.pg_server import start_server
    server = start_server(durable=args.durable)
    try:
        return asyncio.run(main_async(args, server.create_database))
    finally:
        server.destroy()


if __name__ == "__main__":
    sys.exit(main())
