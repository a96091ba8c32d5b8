"""End-to-end benchmark (issue 9): the gateway as a subprocess on its DEFAULT config, the
real ``openai`` provider against a fake OpenAI-compatible server (``tests/fakes``, in this
process), driven through ``POST /v1/chat/completions`` the way users run it.

    .venv/bin/python bench/e2e_bench.py [--concurrency 1,20,100] [--model-delay-ms 0,50]
        [--messages 20] [--paced 70] [--long 1000] [--reps 3] [--keep]

Cases: every (C, model delay) pair, C clients each in its own session sending
``--messages`` messages closed-loop; then a paced run (C=1, 1 turn/s, ``--paced`` turns)
for disk per turn; then one ``--long``-turn session comparing its first and last 100 turns.
Each case starts a fresh gateway in a fresh temp dir: cold start = spawn to first correct
answer (and ``cold_cpu_s``, the CPU the gateway spent until then: what a busy machine
does not inflate). The project's bytecode is compiled once before the first case and the
gateway may write ``.pyc`` files, as for an installed package (``PYTHONDONTWRITEBYTECODE``
is not passed on): cold start measures a restart, not Python compiling every module.
The gateway's stderr is a pipe (as under systemd or in a terminal), so
disk KB/turn counts the files the gateway writes, not a copy of its log made by the bench.
CPU ms/turn is the gateway process's utime+stime (``/proc/<pid>/stat``) over the
measured phase ÷ turns; disk KB/turn is ``/proc/<pid>/io`` ``write_bytes`` ÷ turns, read after the
gateway was made to commit its pending timeline events to SQLite and checkpoint them (so
it includes that cost whatever the flush interval); RSS
is the peak (VmHWM). Run ``--paced 600`` for a long paced run: it spans two of the
timeline's 300 s flushes and their checkpoints. Every case runs ``--reps`` times (3),
each in a fresh gateway; the figures are the medians, with the min–max of the headline
figures. They are printed next to the issue's targets (PASS/FAIL); this is a benchmark,
not a test. The machine is shared: compare the load average printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.fakes.fake_openai import FakeOpenAI

TOKEN = "bench-e2e-token-0123456789abcdef"
TARGETS = {"cpu_ms_c20": 2.5, "disk_kb_paced": 6.0, "p50_ms_c1": 10.0, "cold_s": 1.0,
           "flat_pct": 15.0}
CLK = os.sysconf("SC_CLK_TCK")


def gateway_config(state: Path, model_url: str) -> dict[str, Any]:
    """Only what a user must set: where state lives, a token, and the model."""
    return {"gateway": {"state_dir": str(state), "port": 0, "auth_token": TOKEN},
            "models": {"providers": {"fake": {"api": "openai", "base_url": model_url,
                                              "api_key": "sk-fake"}}},
            "agents": {"defaults": {"model": "fake/fake-model"}}}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def write_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/io").read_text().split("write_bytes:")[1].split()[0])


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))] if s else 0.0


class Gateway:
    """One ``tidegate gateway`` process on a fresh state dir."""

    def __init__(self, tmp: Path, model_url: str) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.state = tmp / "state"
        self.cfg = tmp / "config.yaml"
        self.cfg.write_text(yaml.safe_dump(gateway_config(self.state, model_url)))
        self.log_path = tmp / "gateway.stderr"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TIDEGATE_", "NOTIFY_")) and k != "PYTHONDONTWRITEBYTECODE"}
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "gateway",
                                      "--config", str(self.cfg)], cwd=ROOT, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # stderr is a pipe, as under systemd (journald keeps it) or a terminal: written to a
        # file by the gateway itself it would count the log lines twice in write_bytes
        # (logs/gateway.jsonl has them). Saved to gateway.stderr when the gateway stops.
        self.stderr = bytearray()
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        self.url = ""

    def _read_stderr(self) -> None:
        for chunk in iter(lambda: self.proc.stderr.read1(65536), b""):
            self.stderr += chunk
            del self.stderr[:-(1 << 20)]  # the last MiB is enough to diagnose a failure

    async def ready(self, http: aiohttp.ClientSession) -> None:
        while time.perf_counter() - self.t0 < 60:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}")
            try:
                port = json.loads((self.state / "gateway.json").read_text())["port"]
                self.url = f"http://127.0.0.1:{port}"
                async with http.get(self.url + "/healthz") as r:
                    if r.status == 200:
                        return
            except (OSError, ValueError, KeyError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.01)
        raise TimeoutError("gateway not ready within 60 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._drain.join(5)
        self.log_path.write_bytes(bytes(self.stderr))


async def ask(http: aiohttp.ClientSession, gw: Gateway, session: str, text: str) -> float:
    """One turn; returns its latency in ms. Raises RuntimeError on a wrong answer."""
    t = time.perf_counter()
    async with http.post(gw.url + "/v1/chat/completions", json={
            "model": "tidegate/main", "messages": [{"role": "user", "content": text}]},
            headers={"Authorization": f"Bearer {TOKEN}",
                     "X-Session-Key": f"agent:main:openai:dm:{session}"}) as r:
        data = await r.json(content_type=None)
    got = data.get("choices", [{}])[0].get("message", {}).get("content") if r.status == 200 \
        else data
    if got != f"echo: {text}":
        raise RuntimeError(f"unexpected answer {str(got)[:200]!r}")
    return (time.perf_counter() - t) * 1000


async def commit_timeline(http: aiohttp.ClientSession, gw: Gateway, session: str) -> None:
    """Make the gateway commit its pending timeline events to SQLite and checkpoint them,
    so a disk figure includes that cost whatever the flush interval: a verify request
    flushes before it reads; the checkpoint follows on its own thread."""
    key = f"agent:main:openai:dm:{session}"
    async with http.get(f"{gw.url}/api/sessions/{key}/verify",
                        headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        if r.status != 200 or (await r.json()).get("status") != "verified":
            raise RuntimeError(f"timeline verify answered {r.status}")
    await asyncio.sleep(1.0)


class Probe:
    """CPU seconds and bytes written by the gateway since ``start()``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.cpu0, self.wb0 = cpu_s(pid), write_bytes(pid)

    def delta(self) -> tuple[float, int]:
        return cpu_s(self.pid) - self.cpu0, write_bytes(self.pid) - self.wb0


async def with_gateway(tmp: Path, delay_ms: float, body) -> dict[str, Any]:
    """Fresh fake + gateway; ``body(http, gw)`` measures. Adds cold start and peak RSS."""
    async with FakeOpenAI(latency=delay_ms / 1000) as fake, aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=300)) as http:
        gw = Gateway(tmp, fake.base_url)
        try:
            await gw.ready(http)
            await ask(http, gw, "warmup", "warm up")
            out = {"cold_start_s": time.perf_counter() - gw.t0,
                   "cold_cpu_s": cpu_s(gw.proc.pid)}
            out.update(await body(http, gw))
            out["rss_mb"] = status_kb(gw.proc.pid, "VmHWM") / 1024
            out["model_requests"] = len(fake.requests)
            return out
        finally:
            gw.stop()


async def closed_loop(tmp: Path, conc: int, delay_ms: float, msgs: int) -> dict[str, Any]:
    async def body(http, gw):
        probe, lat = Probe(gw.proc.pid), []

        async def client(i: int) -> None:
            for m in range(msgs):
                lat.append(await ask(http, gw, f"c{i}", f"client {i} message {m}"))
        t0 = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(conc)))
        wall = time.perf_counter() - t0
        cpu = probe.delta()[0]
        await commit_timeline(http, gw, "c0")
        wb = probe.delta()[1]
        n = len(lat)
        return {"turns": n, "turns_per_s": n / wall, "p50_ms": pct(lat, 50),
                "p99_ms": pct(lat, 99), "cpu_ms_per_turn": cpu * 1000 / n,
                "disk_kb_per_turn": wb / 1024 / n}
    return await with_gateway(tmp, delay_ms, body)


async def paced(tmp: Path, turns: int) -> dict[str, Any]:
    """C=1 at 1 turn/s: the disk figure of a quiet, realistic load."""
    async def body(http, gw):
        probe = Probe(gw.proc.pid)
        start = time.perf_counter()
        for m in range(turns):
            await ask(http, gw, "paced", f"paced message {m}")
            await asyncio.sleep(max(0.0, start + m + 1 - time.perf_counter()))
        cpu = probe.delta()[0]
        await commit_timeline(http, gw, "paced")
        wb = probe.delta()[1]
        return {"turns": turns, "disk_kb_per_turn": wb / 1024 / turns,
                "cpu_ms_per_turn": cpu * 1000 / turns}
    return await with_gateway(tmp, 0.0, body)


async def long_session(tmp: Path, turns: int) -> dict[str, Any]:
    """One session, ``turns`` turns: CPU and latency of the first vs the last 100."""
    async def body(http, gw):
        marks: dict[int, float] = {}
        lat: list[float] = []
        for m in range(turns):
            if m in (0, 100, turns - 100):
                marks[m] = cpu_s(gw.proc.pid)
            lat.append(await ask(http, gw, "long", f"turn {m} of a long conversation"))
            if m == 99:
                marks[-100] = cpu_s(gw.proc.pid)  # the end of the first 100
        marks[turns] = cpu_s(gw.proc.pid)
        first = (marks[-100] - marks[0]) * 10  # ms per turn over 100 turns
        last = (marks[turns] - marks[turns - 100]) * 10
        return {"turns": turns, "first100_cpu_ms": first, "last100_cpu_ms": last,
                "grow_pct": 100 * (last / max(first, 1e-9) - 1),
                "first100_p50_ms": pct(lat[:100], 50), "last100_p50_ms": pct(lat[-100:], 50)}
    return await with_gateway(tmp, 0.0, body)


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key, the median over the reps (non-numbers from the first); ``<key>_range`` is
    (min, max) for the headline figures."""
    out: dict[str, Any] = {"reps": len(runs)}
    for key, first in runs[0].items():
        vals = [r[key] for r in runs if key in r]
        if isinstance(first, (int, float)) and not isinstance(first, bool):
            out[key] = statistics.median_low(vals) if all(isinstance(v, int) for v in vals) \
                else statistics.median(vals)
            if key in RANGED:
                out[key + "_range"] = (min(vals), max(vals))
        else:
            out[key] = first
    return out


RANGED = ("turns_per_s", "p50_ms", "cpu_ms_per_turn", "disk_kb_per_turn", "cold_start_s",
          "first100_cpu_ms", "last100_cpu_ms", "grow_pct")


async def repeated(reps: int, label: str, run) -> dict[str, Any]:
    """``run(i)`` ``reps`` times; prints each rep's JSON line, returns the medians."""
    runs = []
    for i in range(reps):
        runs.append(await run(i))
        print(json.dumps({"case": label, "rep": i + 1, **runs[-1]}), flush=True)
    return median_of(runs)


def rng(c: dict[str, Any], key: str, fmt: str = ".1f") -> str:
    lo, hi = c.get(key + "_range", (c[key], c[key]))
    return f"{c[key]:{fmt}} ({lo:{fmt}}–{hi:{fmt}})" if c.get("reps", 1) > 1 else \
        f"{c[key]:{fmt}}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(cases: list[dict[str, Any]], pace: dict[str, Any] | None,
           long: dict[str, Any] | None) -> None:
    reps = max([c.get("reps", 1) for c in cases] or [1])
    print(f"\nmedians of {reps} (min–max); load average {os.getloadavg()[0]:.2f} (2 cores "
          "shared: compare runs at a similar load)")
    print("cold start: the project's .pyc files were compiled before the first case and "
          "PYTHONDONTWRITEBYTECODE is not passed on (an installed package has its .pyc); "
          "disk: stderr is a pipe, pending timeline events committed before reading\n")
    print("| C | model | turns/s | p50 ms | p99 ms | CPU ms/turn | disk KB/turn | RSS MB "
          "| cold start s | cold CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in cases:
        print(f"| {c['C']} | {c['delay']:g} ms | {rng(c, 'turns_per_s')} | {rng(c, 'p50_ms')} "
              f"| {c['p99_ms']:.1f} | {rng(c, 'cpu_ms_per_turn', '.2f')} | "
              f"{rng(c, 'disk_kb_per_turn', '.2f')} | {c['rss_mb']:.0f} | "
              f"{rng(c, 'cold_start_s', '.2f')} | {c['cold_cpu_s']:.2f} |")
    print("\ntargets:")
    by = {(c["C"], c["delay"]): c for c in cases}
    if (20, 0.0) in by:
        v = by[(20, 0.0)]["cpu_ms_per_turn"]
        print(f"  CPU per turn, C=20, 0 ms        {v:7.2f} ms   <= 2.5 ms   "
              f"{verdict(v <= TARGETS['cpu_ms_c20'])}")
    if (1, 0.0) in by:
        v = by[(1, 0.0)]["p50_ms"]
        print(f"  p50, C=1, 0 ms                  {v:7.2f} ms   <= 10 ms    "
              f"{verdict(v <= TARGETS['p50_ms_c1'])}")
    if cases:
        v = max(c["cold_start_s"] for c in cases)
        cpu = max(c["cold_cpu_s"] for c in cases)
        print(f"  cold start to first answer (max){v:7.2f} s    <= 1 s      "
              f"{verdict(v <= TARGETS['cold_s'])}  (gateway CPU until then {cpu:.2f} s)")
    if pace:
        v = pace["disk_kb_per_turn"]
        print(f"  disk per turn, C=1 at 1 turn/s  {rng(pace, 'disk_kb_per_turn', '.2f')} KB  "
              "<= 6 KB     "
              f"{verdict(v <= TARGETS['disk_kb_paced'])}  ({pace['turns']} turns, "
              f"{pace['cpu_ms_per_turn']:.2f} ms CPU/turn)")
    if long:
        grow = long["grow_pct"]  # the median of each rep's growth
        print(f"  {long['turns']}-turn session: CPU/turn first 100 "
              f"{long['first100_cpu_ms']:.2f} ms, last 100 {long['last100_cpu_ms']:.2f} ms "
              f"({grow:+.0f}%)   <= +15%   {verdict(grow <= TARGETS['flat_pct'])}")
        print(f"      p50 first 100 {long['first100_p50_ms']:.2f} ms, last 100 "
              f"{long['last100_p50_ms']:.2f} ms")


async def main_async(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="tidegate-e2e-"))
    cases: list[dict[str, Any]] = []
    # before anything is timed, so nothing else runs on the loop yet
    subprocess.run([sys.executable, "-m", "compileall", "-q", "gateway", "runtime",  # noqa: ASYNC221
                    "channels", "scheduler"], cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
    reps = max(1, args.reps)
    try:
        for delay in args.model_delay_ms:
            for conc in args.concurrency:
                name = f"c{conc}-d{delay:g}"
                r = await repeated(reps, name, lambda i, c=conc, d=delay, n=name: closed_loop(
                    root / f"{n}-r{i}", c, d, args.messages))
                cases.append({"C": conc, "delay": delay, **r})
        pace = await repeated(reps, "paced", lambda i: paced(root / f"paced-r{i}", args.paced)) \
            if args.paced else None
        long = await repeated(reps, "long", lambda i: long_session(
            root / f"long-r{i}", args.long)) if args.long >= 200 else None
        report(cases, pace, long)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def main() -> int:
    def floats(s: str) -> list[float]:
        return [float(x) for x in s.split(",") if x]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",") if x],
                    default=[1, 20, 100])
    ap.add_argument("--model-delay-ms", type=floats, default=[0.0, 50.0])
    ap.add_argument("--messages", type=int, default=20, help="messages per client (20)")
    ap.add_argument("--paced", type=int, default=70,
                    help="turns of the 1 turn/s run (70; 600 spans two 300 s timeline "
                         "flushes; 0 off)")
    ap.add_argument("--reps", type=int, default=3, help="runs per case; medians (3)")
    ap.add_argument("--long", type=int, default=1000, help="turns of the long session (1000)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs")
    return asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
