"""Forwarded turns benchmark (README "Replicas": every entry point runs a session's turn
on the replica that holds its lane): two ``tidegate gateway`` replicas on one real
PostgreSQL (started here in a temp dir), the OpenAI-compatible API on both, the built-in
echo model (no model server: what is measured is the gateway).

    .venv/bin/python bench/forwarding_bench.py [--turns 200] [--sessions 16] [--rounds 3]

Every session's lane is first taken by replica A (one message there); then, while the
lanes stay held (the sessions keep sending):

- latency: ``--turns`` requests one after another for one session, sent to A (local)
  and to B (forwarded to A and answered through PostgreSQL): p50/p99 of each and the
  overhead of forwarding one turn = p50(forwarded) - p50(local), plain and streamed;
- throughput: ``--sessions`` sessions, ``--rounds`` messages each, all sessions at
  once (closed loop: the next message when the reply came), sent to A, then to B:
  turns/s of each.

Target: forwarding one turn costs <= 10 ms at p50 and the forwarded surface keeps >= 50 %
of the local turns/s. The machine is shared: compare the load average printed. A
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cluster_harness import start_private_server
from tests.helpers import GatewayProcess, base_config


def chat(gp: GatewayProcess, user: str, text: str, stream: bool = False) -> str:
    body = {"model": "tidegate/main", "user": user, "stream": stream,
            "messages": [{"role": "user", "content": text}]}
    req = urllib.request.Request(f"http://127.0.0.1:{gp.port}/v1/chat/completions",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {gp.token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()


def replicas(tmp: Path, dsn: str) -> dict[str, GatewayProcess]:
    procs = {}
    for name in ("a", "b"):
        cfg = base_config(tmp / name / "state", None,
                          channels={"openai_api": {"enabled": True}},
                          storage={"backend": "postgres", "dsn": dsn},
                          cluster={"lease_ttl": "15s", "replica_id": name})
        cfg["cron"] = {"enabled": False}
        (tmp / name).mkdir(parents=True)
        procs[name] = GatewayProcess(tmp / name, cfg)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda p: p.start(timeout=60), procs.values()))
    return procs


def latency(gp: GatewayProcess, user: str, turns: int, stream: bool) -> list[float]:
    out = []
    for i in range(turns):
        t0 = time.perf_counter()
        chat(gp, user, f"m{i}", stream)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def throughput(gp: GatewayProcess, users: list[str], rounds: int) -> float:
    def one(user: str) -> None:
        for i in range(rounds):
            chat(gp, user, f"r{i}")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(users)) as pool:
        list(pool.map(one, users))
    return len(users) * rounds / (time.perf_counter() - t0)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    server = start_private_server()
    tmp = Path(tempfile.mkdtemp(prefix="tidegate-fwd-"))
    procs: dict[str, GatewayProcess] = {}
    try:
        procs = replicas(tmp, server.create_database())
        a, b = procs["a"], procs["b"]
        users = [f"s{i}" for i in range(args.sessions)]
        for u in ["lat", "lats", *users]:
            chat(a, u, "take the lane")  # every lane held by a
        print(f"load average {os.getloadavg()[0]:.2f}")
        rows = {}
        for label, gp, stream in (("local", a, False), ("forwarded", b, False),
                                  ("local streamed", a, True),
                                  ("forwarded streamed", b, True)):
            xs = latency(gp, "lats" if stream else "lat", args.turns, stream)
            rows[label] = statistics.median(xs)
            print(f"{label:>19}: p50 {rows[label]:6.2f} ms  p99 {pct(xs, 0.99):6.2f} ms")
        plain = rows["forwarded"] - rows["local"]
        streamed = rows["forwarded streamed"] - rows["local streamed"]
        print(f"forwarding overhead per turn (p50): {plain:.2f} ms plain, "
              f"{streamed:.2f} ms streamed (target <= 10 ms)")
        local = throughput(a, users, args.rounds)
        fwd = throughput(b, users, args.rounds)
        print(f"turns/s: local {local:.1f}, forwarded {fwd:.1f} "
              f"({100 * fwd / local:.0f} % of local; target >= 50 %)")
        print(f"load average {os.getloadavg()[0]:.2f}")
        return 0
    finally:
        for p in procs.values():
            p.stop()
        server.destroy()


if __name__ == "__main__":
    sys.exit(main())
