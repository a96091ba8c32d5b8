"""Randomized fault checker for replicas (issue 23), in the spirit of Jepsen: N real
``tidegate gateway`` replicas on a real PostgreSQL (a throwaway server in a temp dir), one
fake Telegram bot account, the fake OpenAI model recording every call, an isolated cron job.
A seeded generator sends messages to random sessions through random surfaces (Telegram,
the OpenAI-compatible endpoint, ``tidegate agent -m``) and replicas; a seeded nemesis kills
(-9), pauses (SIGSTOP past the lease TTL), restarts replicas, stops PostgreSQL and slows
the model. Afterwards the history is checked (tests/cluster_check/checker.py): serial,
ordered model calls per session, one session id per key, one reply per accepted message
(or a recorded outcome), timelines verify, cron occurrences neither lost nor doubled.

    .venv/bin/python bench/cluster_checker.py [--seed S] [--runs N] [--duration 120]
        [--replicas 3] [--faults kill,pause,restart,pg,slow] [--sessions 6] [--rate 3]
        [--surfaces telegram,openai,openai-stream,cli] [--ttl 3] [--cron-every 5]

Each run prints its seed; ``--seed S`` replays that plan (same messages, surfaces,
replicas and faults at the same offsets; the interleaving of real processes still varies).
Target: 0 anomalies. A benchmark-style tool, not a test (exit 1 when anomalies are found).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cluster_check import nemesis
from tests.cluster_check.generator import SURFACES
from tests.cluster_check.run import report, run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, help="replay this seed (default: a random one)")
    ap.add_argument("--runs", type=int, default=1, help="runs with consecutive seeds")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of load per run")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--faults", default=",".join(nemesis.KINDS),
                    help=f"comma-separated subset of {','.join(nemesis.KINDS)}; '' = none")
    ap.add_argument("--surfaces", default=",".join(SURFACES),
                    help=f"comma-separated subset of {','.join(SURFACES)}")
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--rate", type=float, default=3.0, help="messages per second")
    ap.add_argument("--ttl", type=float, default=3.0, help="cluster.lease_ttl (s)")
    ap.add_argument("--cron-every", type=float, default=5.0, help="0: no cron job")
    ap.add_argument("--examples", type=int, default=3, help="examples per anomaly kind")
    args = ap.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    bad = set(faults) - set(nemesis.KINDS)
    if bad:
        ap.error(f"--faults: unknown {sorted(bad)} (known: {', '.join(nemesis.KINDS)})")
    weights = {k: v for k, v in SURFACES.items() if k in args.surfaces.split(",")}
    if not weights:
        ap.error(f"--surfaces: none of {', '.join(SURFACES)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    total = 0
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    for k in range(args.runs):
        r = run(seed=seed + k, duration=args.duration, replicas=args.replicas, faults=faults,
                sessions=args.sessions, rate=args.rate, ttl=args.ttl,
                cron_every=args.cron_every, surfaces=weights)
        print(report(r, args.examples), flush=True)
        total += sum(len(v) for v in r.anomalies.values())
    print(f"total anomalies: {total} (target 0: {'PASS' if total == 0 else 'FAIL'})")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
