"""Fault injection against one gateway (the outcome rule, docs/outcomes.md): messages over
Telegram, Slack, Discord, the OpenAI-compatible endpoint and webchat while the gateway is
killed with SIGKILL at random instants (and started again), PostgreSQL is stopped for 5 s,
the model answers 500, 429 or not at all for a while, and a poison message kills the
gateway each time its turn runs. Afterwards, from outside: every accepted message has
exactly one outcome, no chat shows a reply twice, the dead letters are exactly the poison
message, nothing is left without an outcome (tests/fault_injection/).

    .venv/bin/python bench/fault_injection.py [--seed S] [--runs N] [--messages 1000]
        [--duration 60] [--kills 8] [--pg-stops 2] [--model-windows 6]
        [--storage postgres|embedded]

Each run prints its seed; ``--seed S`` replays that plan. Target: 0 anomalies (exit 1
otherwise).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fault_injection.run import report, run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, help="replay this seed (default: a random one)")
    ap.add_argument("--runs", type=int, default=1, help="runs with consecutive seeds")
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load per run")
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--pg-stops", type=int, default=2)
    ap.add_argument("--model-windows", type=int, default=6)
    ap.add_argument("--settle", type=float, default=180.0)
    ap.add_argument("--storage", choices=("postgres", "embedded"), default="postgres",
                    help="embedded: the intake journal and SQLite (PostgreSQL is still "
                         "stopped, with nothing using it)")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
    total = 0
    for k in range(args.runs):
        r = run(seed=seed + k, messages=args.messages, duration=args.duration,
                kills=args.kills, pg_stops=args.pg_stops, model_windows=args.model_windows,
                settle=args.settle, storage=args.storage)
        print(report(r), flush=True)
        total += sum(len(v) for v in r.anomalies.values())
    print(f"total anomalies: {total} (target 0: {'PASS' if total == 0 else 'FAIL'})")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
