"""One fault-injection run: start the system, send the plan while the nemesis works,
heal, let every message settle, collect what the outside world shows, check it.

``run(seed=..., messages=..., duration=..., kills=...)`` returns a :class:`Result`;
``report(result)`` renders it. The same seed gives the same plan of messages and faults
(the interleaving of real processes still varies).
"""

from __future__ import annotations

import logging
import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tests.fault_injection import check, load, nemesis
from tests.fault_injection.system import System


@dataclass
class Result:
    seed: int
    observed: check.Observed
    anomalies: dict[str, list[str]]
    faults: list[nemesis.Fault]
    took: float
    settle: float
    deaths: int
    boots: int


def run(*, seed: int, messages: int = 200, duration: float = 12.0, kills: int = 2,
        pg_stops: int = 1, model_windows: int = 3, settle: float = 90.0,
        tmp: Path | None = None, storage: str = "postgres", log=print) -> Result:
    """One run (module docstring); ``log`` gets progress lines."""
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # cut model calls
    rng = random.Random(seed)
    msgs = load.plan(rng, messages, duration, poison_at=rng.uniform(0.2, 0.5) * duration)
    proc_faults, model_faults = nemesis.plan(rng, duration, kills=kills, pg_stops=pg_stops,
                                             model_windows=model_windows)
    tmp = tmp or Path(tempfile.mkdtemp(prefix="tidegate-faults-"))
    sys = System(tmp, storage=storage)
    started = time.time()
    try:
        sys.start()
        log(f"seed {seed}: {len(msgs)} messages over {duration:g}s, "
            f"{len(proc_faults)} process and {len(model_faults)} model faults "
            f"(boot {time.time() - started:.1f}s)")
        stop = threading.Event()
        t0 = time.time()
        threads = [threading.Thread(target=fn, args=(sys, faults, t0, stop), name=name)
                   for fn, faults, name in ((nemesis.run_process, proc_faults, "nemesis"),
                                            (nemesis.run_model, model_faults, "model"))]
        for t in threads:
            t.start()
        load.run_plan(sys, msgs, t0, stop, workers=16)
        for t in threads:
            t.join()
        healed = time.time()
        check.settle(sys, msgs, settle)
        observed = check.collect(sys, msgs)
        anomalies = check.check(observed)
        return Result(seed, observed, anomalies, [*proc_faults, *model_faults],
                      healed - t0, time.time() - healed, sys.deaths, sys.boots)
    finally:
        sys.close()


def report(r: Result, examples: int = 5) -> str:
    """The human report of a run."""
    o = r.observed
    lines = [(f"seed {r.seed}: {len(o.msgs)} messages in {r.took:.1f}s, settled "
             f"{r.settle:.1f}s after; gateway starts {r.boots}, deaths on its own "
             f"{r.deaths}, model calls {len(o.calls)}"),
             "sent: " + ", ".join(f"{k} {v}" for k, v in sorted(
                 Counter(f"{m.surface}:{m.status}" for m in o.msgs).items())),
             "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(
                 Counter(row.get("outcome") for row in o.outcomes).items())),
             "faults: " + ", ".join(f"{f.kind}@{f.at:.1f}s" + (f" ({f.note})" if f.note
                                                              else "")
                                    for f in r.faults if f.start)]
    total = sum(len(v) for v in r.anomalies.values())
    lines.append(f"anomalies: {total}" + (f" (replay: --seed {r.seed})" if total else ""))
    for kind, items in sorted(r.anomalies.items()):
        lines.append(f"  {kind}: {len(items)}")
        lines += [f"    {x}" for x in items[:examples]]
    return "\n".join(lines)
