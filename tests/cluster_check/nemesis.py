"""The nemesis: a seeded schedule of faults, executed one at a time in real time, each
healed before the next.

Kinds: ``kill`` (kill -9 a running replica, start it again 1-2 lease TTLs later),
``pause`` (SIGSTOP a replica for 1.5-2 lease TTLs, then SIGCONT: the others presume it
dead and take over while it sleeps), ``restart`` (SIGTERM and start again), ``pg`` (stop
PostgreSQL for 2-5 s), ``midturn`` (the model slowed to 1 s, then kill -9 of the replica
holding the most lanes, the Telegram account's owner on a tie, while its turns are in the
model; started again 1-2 TTLs later), ``slow`` (the model answers after 0.5-1.5 s instead of its
latency, for 3-6 s; under the lease TTL, so a killed replica's call ends before a
takeover can start the next).
"""

from __future__ import annotations

import random
import subprocess
import threading
import time
from dataclasses import dataclass

from tests.cluster_check.cluster import Cluster

KINDS = ("kill", "pause", "restart", "pg", "slow", "midturn")


@dataclass
class Fault:
    """One fault: ``start``/``end`` epoch seconds of the fault's window (until healed)."""

    kind: str
    target: str
    hold: float
    at: float
    start: float = 0.0
    end: float = 0.0
    note: str = ""


def plan(rng: random.Random, duration: float, replicas: list[str], kinds: list[str],
         ttl: float, *, first: float = 3.0, gap: tuple[float, float] = (2.0, 6.0)
         ) -> list[Fault]:
    """The seeded schedule; ``at`` is the earliest offset from the run's start (a fault
    begins once the previous one is healed)."""
    out, t = [], first
    holds = {"kill": (ttl, 2 * ttl), "midturn": (ttl, 2 * ttl), "pause": (1.5 * ttl, 2 * ttl), "restart": (0, 0),
             "pg": (2.0, 5.0), "slow": (3.0, 6.0)}
    while kinds and t < duration:
        kind = rng.choice(kinds)
        lo, hi = holds[kind]
        out.append(Fault(kind, rng.choice(replicas) if kind in ("kill", "pause", "restart")
                         else "-", rng.uniform(lo, hi), t))
        t += rng.uniform(*gap) + out[-1].hold
    return out


def _inject(cluster: Cluster, f: Fault, stop: threading.Event, revive: bool) -> None:
    if f.kind == "kill":
        cluster.kill9(f.target)
        if revive:
            stop.wait(f.hold)
            cluster.replicas[f.target].start(timeout=90)
    elif f.kind == "midturn":
        cluster.set_latency(1.0)
        stop.wait(0.6)
        f.target = cluster.busiest()
        cluster.kill9(f.target)
        cluster.set_latency(cluster.latency)
        if revive:
            stop.wait(f.hold)
            cluster.replicas[f.target].start(timeout=90)
    elif f.kind == "pause":
        cluster.pause(f.target)
        stop.wait(f.hold)
        cluster.resume(f.target)
    elif f.kind == "restart":
        cluster.restart(f.target)
    elif f.kind == "pg":
        cluster.pg.stop("fast")
        stop.wait(f.hold)
        cluster.pg.start()
    elif f.kind == "slow":
        cluster.set_latency(min(f.hold / 4, 1.5))
        stop.wait(f.hold)
        cluster.set_latency(cluster.latency)


def run(cluster: Cluster, faults: list[Fault], t0: float, stop: threading.Event,
        revive: bool = True) -> None:
    """Inject ``faults`` in order (each at ``t0 + at`` at the earliest); stops early when
    ``stop`` is set. A replica that does not come back is noted on its fault (and started
    again by the final heal). ``revive=False``: a killed replica stays down."""
    for f in faults:
        delay = t0 + f.at - time.time()
        if (delay > 0 and stop.wait(delay)) or stop.is_set():
            return
        if f.target != "-" and not cluster.running(f.target):
            f.note = "skipped: not running"
            continue
        f.start = time.time()
        try:
            _inject(cluster, f, stop, revive)
        except (RuntimeError, TimeoutError, AssertionError,
                subprocess.TimeoutExpired) as exc:  # e.g. a SIGTERM that never exits
            f.note = f"did not recover: {str(exc)[:300]}"
        f.end = time.time()
