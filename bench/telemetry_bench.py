"""What OpenTelemetry tracing costs (telemetry.otlp): off must be free, on must be cheap.

    .venv/bin/python bench/telemetry_bench.py [--turns 300] [--reps 3]

1. **Imports when off**: a fresh interpreter imports the gateway and starts one on a
   default config (no telemetry section); no ``opentelemetry.sdk`` module may be loaded.
2. **Hooks when off**: the tracing hooks one turn with one tool call runs (turn, 2 model
   attempts, 2 traceparent injections, 1 tool call, 1 platform send, annotate, content),
   timed with ``timeit``: ns per turn.
3. **Turns off vs on**: the gateway in this process, a fake OpenAI-compatible model
   (tests/fakes) and, for "on", a local OTLP/HTTP receiver (tests/fakes/fake_otlp.py,
   decoding every batch) with ``sample_ratio: 1``; ``--turns`` sequential turns through
   ``POST /v1/chat/completions``: median and p99 latency and CPU ms per turn (this process:
   gateway, fake model and client together, the same in every case). Each case runs
   ``--reps`` times in a fresh gateway; medians are printed.

Targets: off imports nothing of the SDK; the off hooks cost < 0.1 % of an untraced
turn's CPU (case 3); on adds < 15 % CPU per turn. A benchmark, not a test: the machine is
shared, compare the load average printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_otlp import OtlpReceiver
from tests.helpers import base_config, running_gateway

_IMPORTS = """
import asyncio, sys, tempfile
from pathlib import Path
from tests.helpers import base_config, running_gateway
async def main():
    with tempfile.TemporaryDirectory() as tmp:
        async with running_gateway(base_config(Path(tmp) / "state")):
            pass
asyncio.run(main())
print(sum(1 for m in sys.modules if m.startswith("opentelemetry.sdk")),
      sum(1 for m in sys.modules if m.startswith("opentelemetry")))
"""


def imports_when_off() -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", _IMPORTS], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    return int(out[-2]), int(out[-1])


def hooks_when_off(number: int = 200_000) -> float:
    """ns per turn of the hooks a one-tool-call turn runs, tracing off."""
    from runtime import telemetry

    def one_turn() -> None:
        with telemetry.turn("main", 0, 1):
            for _ in range(2):
                with telemetry.span("model.attempt", {}) as sp:
                    telemetry.inject(None)
                    sp.is_recording()
            with telemetry.span("tool.call", {}) as sp:
                sp.set_attribute("tidegate.tool.is_error", False)
                telemetry.content(sp, {})
            with telemetry.span("platform.send", {}) as sp:
                sp.set_attributes({})
                telemetry.content(sp, {})
            telemetry.annotate({})
    assert not telemetry.enabled()
    return min(timeit.repeat(one_turn, number=number, repeat=3)) / number * 1e9


async def turns(n: int, tracing: bool) -> dict[str, float]:
    receiver = OtlpReceiver().start_in_thread() if tracing else None
    try:
        async with FakeOpenAI() as model:
            with tempfile.TemporaryDirectory() as tmp:
                extra = {"telemetry": {"otlp": {"endpoint": receiver.url,
                                                "interval": "0.5s"}}} if receiver else {}
                cfg = base_config(Path(tmp) / "state", model.base_url, **extra)
                async with running_gateway(cfg) as gw:
                    return await _drive(gw, n)
    finally:
        if receiver is not None:
            receiver.stop()


async def _drive(gw, n: int) -> dict[str, float]:
    url = f"http://127.0.0.1:{gw.port}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {gw.token}",
               "X-Session-Key": "agent:main:openai:dm:bench"}
    lat: list[float] = []
    async with aiohttp.ClientSession() as http:
        for i in range(n + 20):  # the first 20 warm up
            if i == 20:
                cpu0 = time.process_time()
            t = time.perf_counter()
            async with http.post(url, headers=headers, json={
                    "model": "tidegate/main",
                    "messages": [{"role": "user", "content": f"m{i}"}]}) as r:
                assert r.status == 200, await r.text()
                await r.read()
            if i >= 20:
                lat.append((time.perf_counter() - t) * 1000)
    cpu = (time.process_time() - cpu0) * 1000 / n
    lat.sort()
    return {"p50": statistics.median(lat), "p99": lat[int(len(lat) * 0.99) - 1], "cpu": cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import logging

    import structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    sdk, any_otel = imports_when_off()
    print(f"imports when off: {sdk} opentelemetry.sdk modules ({any_otel} opentelemetry* "
          f"in all)   target 0   {'PASS' if sdk == 0 else 'FAIL'}")
    ns = hooks_when_off()
    res = {}
    for _ in range(args.reps):  # interleaved: both see the same machine load
        for tracing in (False, True):
            res.setdefault(tracing, []).append(asyncio.run(turns(args.turns, tracing)))
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("p50", "p99", "cpu")}
           for k, v in res.items()}
    for k, label in ((False, "off"), (True, "on ")):
        m = med[k]
        print(f"turns, tracing {label}: p50 {m['p50']:.2f} ms  p99 {m['p99']:.2f} ms  "
              f"CPU {m['cpu']:.2f} ms/turn  ({len(res[k])} runs x {args.turns} turns)")
    share = ns / 1e6 / med[False]["cpu"] * 100
    print(f"hooks when off: {ns:.0f} ns per turn = {share:.3f} % of an untraced turn's CPU"
          f"   target < 0.1 %   {'PASS' if share < 0.1 else 'FAIL'}")
    extra = (med[True]["cpu"] / med[False]["cpu"] - 1) * 100
    print(f"tracing on adds {extra:+.1f} % CPU per turn   target < 15 %   "
          f"{'PASS' if extra < 15 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
