"""The nemesis: a seeded schedule of faults over the run, on two timelines.

The process timeline runs one fault at a time, each healed before the next: ``kill``
(SIGKILL of the gateway at a random instant, started again 0.3-1.5 s later) and ``pg``
(PostgreSQL stopped for 5 s, then started). The model timeline switches the fault model's
mode for a while: ``500`` and ``429`` windows of 1-2 s, ``hang`` windows of 2-3 s (calls
that never answer: the gateway's model timeout ends them).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from tests.fault_injection.system import System

PG_DOWN = 5.0  # s


@dataclass
class Fault:
    """One fault: ``at`` its planned offset (s); ``start``/``end`` epoch s once run."""

    kind: str
    at: float
    hold: float
    start: float = 0.0
    end: float = 0.0
    note: str = ""


def plan(rng: random.Random, duration: float, *, kills: int, pg_stops: int = 1,
         model_windows: int = 3) -> tuple[list[Fault], list[Fault]]:
    """(process faults, model faults), each sorted by ``at``: kills anywhere in
    ``[1, duration]``; PostgreSQL stops in the second half and the model windows in the
    first (a model window while the database is down would meet no model call: the
    turns wait for the database)."""
    proc = [Fault("kill", rng.uniform(1, duration), rng.uniform(0.3, 1.5))
            for _ in range(kills)]
    proc += [Fault("pg", rng.uniform(0.55, 0.8) * duration, PG_DOWN)
             for _ in range(pg_stops)]
    kinds = [("500", "429", "hang")[i % 3] for i in range(model_windows)]
    model = [Fault(k, rng.uniform(0.5, 0.5 * duration),
                   rng.uniform(2, 3) if k == "hang" else rng.uniform(1, 2)) for k in kinds]
    return sorted(proc, key=lambda f: f.at), sorted(model, key=lambda f: f.at)


def _process_fault(sys: System, f: Fault, stop: threading.Event) -> None:
    if f.kind == "kill":
        sys.kill9()
        try:
            stop.wait(f.hold)
            sys.boot()
        finally:
            sys.release()
    else:
        sys.pg.stop("fast")
        try:
            stop.wait(f.hold)
        finally:
            sys.pg.start()


def run_process(sys: System, faults: list[Fault], t0: float, stop: threading.Event) -> None:
    """Inject ``faults`` in order, each at ``t0 + at`` at the earliest."""
    for f in faults:
        delay = t0 + f.at - time.time()
        if (delay > 0 and stop.wait(delay)) or stop.is_set():
            return
        f.start = time.time()
        try:
            _process_fault(sys, f, stop)
        except (RuntimeError, TimeoutError, AssertionError) as exc:
            f.note = f"did not recover: {str(exc)[-400:]}"
        f.end = time.time()


def run_model(sys: System, faults: list[Fault], t0: float, stop: threading.Event) -> None:
    """Switch the model's mode for each window (overlapping windows: the later wins)."""
    server = sys.model.server
    for f in faults:
        delay = t0 + f.at - time.time()
        if (delay > 0 and stop.wait(delay)) or stop.is_set():
            return
        f.start = time.time()
        server.mode = f.kind
        stop.wait(f.hold)
        server.mode = "ok"
        f.end = time.time()
