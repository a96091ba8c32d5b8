"""Gateway benchmark (issue 2, "How it is proven", last bullet; DESIGN.md "Performance").

Run: ``.venv/bin/python bench/gateway_bench.py [--sessions 100] [--turns-per-session 20]
[--transcript-mb 100] [--profile] [--no-http] [--long-turns 2000]``

Drives N concurrent sessions through the real ``gateway.daemon.Gateway`` (in-process, built
with ``parse_config``) with the built-in zero-latency ``echo`` provider (no model configured
= ``echo/diagnostic``), and prints figures next to the targets (PASS/FAIL):

- gateway overhead per turn, p50/p99 [<= 2 ms / <= 10 ms at 100 concurrent sessions]:
  intake (``gw.local.submit``: routing, lane enqueue) + the lane runner (session lookup,
  context, prompt, the turn, transcript appends, store touch, logging, delivery) minus the
  model's time (``TurnResult.model_ms``). The wait for a lane slot under the global cap
  (``lanes.main``, default 4) is not overhead and is reported on its own, as is the
  end-to-end time per message (submit -> future resolved).
- turns per second [>= 300/s]; process CPU per turn (DESIGN.md compares CPU per turn).
- RSS of an idle gateway [<= 120 MB]: a real ``tidegate gateway`` process after READY
  (the in-process figure includes this harness); RSS after the run.
- loading the tail of a 100 MB transcript [<= 50 ms]: written in the real format with
  ``TranscriptWriter``; timed ``SessionLog(...).messages()`` (a fresh object, as after a
  restart; page cache warm and evicted with ``posix_fadvise``) and ``read_tail``.
- the same traffic through the HTTP control API (``POST /api/agent``, aiohttp client, one
  connection per session) against a real gateway process: end-to-end latency incl. HTTP.
- with ``--long-turns``: one session run for many turns, to check that a turn's cost does
  not grow with the session's length.
- with ``--profile``: the in-process run again under cProfile, top costs in µs per turn.

Traffic: each session sends its next message when the reply to the previous one arrived
(closed loop), queue mode ``followup`` with debounce 0 (every message its own turn, no
batching: the throughput setting). Logging is configured as the daemon does (JSON lines to
``<state_dir>/logs/gateway.jsonl`` and to stderr, here /dev/null) at ``--log-level``.
Not a timed test: it prints figures. Uses a temp dir; touches nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import yaml  # noqa: E402

from gateway.config_load import parse_config  # noqa: E402
from gateway.daemon import Gateway  # noqa: E402
from gateway.logs import configure_logging, reset_logging  # noqa: E402
from runtime.clock import SYSTEM_CLOCK  # noqa: E402
from runtime.context import SessionLog, assistant_message, tool_result_message, user_message  # noqa: E402
from runtime.providers.base import ToolCall  # noqa: E402
from runtime.transcript import TranscriptWriter, read_tail  # noqa: E402

TARGETS = {"overhead_p50_ms": 2.0, "overhead_p99_ms": 10.0, "turns_per_s": 300.0,
           "tail_ms": 50.0, "idle_rss_mb": 120.0}


# -- small helpers -----------------------------------------------------------------------

def rss_mb(pid: int | str = "self") -> float:
    """Resident set size of a process in MB (VmRSS from /proc, Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def verdict(value: float, target: float, higher_is_better: bool = False) -> str:
    ok = value >= target if higher_is_better else value <= target
    return "PASS" if ok else "FAIL"


def row(label: str, value: str, target: str = "", result: str = "") -> None:
    print(f"  {label:<44} {value:>22}  {target:<12} {result}")


def dist(values: list[float]) -> str:
    return (f"p50 {pct(values, 50):.3f}  p99 {pct(values, 99):.3f}  max {max(values):.3f}"
            if values else "-")


def bench_config(state_dir: Path, cap: int | None, log_level: str) -> dict[str, Any]:
    """A gateway config: no model (echo), followup/0 queue, free port, webchat on."""
    cfg: dict[str, Any] = {
        "gateway": {"state_dir": str(state_dir), "port": 0, "shutdown_grace": "10s"},
        "logging": {"level": log_level, "format": "json"},
        "messages": {"queue": {"mode": "followup", "debounce": 0}},
    }
    if cap is not None:
        cfg["lanes"] = {"main": cap}
    return cfg


# -- in-process load ---------------------------------------------------------------------

@dataclass(slots=True)
class Sample:
    """One message's timestamps (perf_counter seconds) and the turn's own figures (ms)."""

    session: int
    turn: int
    t_submit: float
    t_queued: float
    t_start: float
    t_end: float
    t_done: float
    duration_ms: float
    model_ms: float

    @property
    def overhead_ms(self) -> float:
        """Intake + lane runner time minus model time."""
        return ((self.t_queued - self.t_submit) + (self.t_end - self.t_start)) * 1000 \
            - self.model_ms

    @property
    def lane_wait_ms(self) -> float:
        return (self.t_start - self.t_queued) * 1000

    @property
    def e2e_ms(self) -> float:
        return (self.t_done - self.t_submit) * 1000


class RunnerProbe:
    """Wraps the LaneManager's runner (its public ``runner`` attribute) to timestamp when
    a turn gets its lane slot and when it returns. Adds two perf_counter calls a turn."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}

    async def __call__(self, key: str, payloads: list[Any], control: Any) -> Any:
        run_id = payloads[0].run_id
        self.start[run_id] = time.perf_counter()
        try:
            return await self.runner(key, payloads, control)
        finally:
            self.end[run_id] = time.perf_counter()


async def drive(gw: Gateway, sessions: int, turns: int, tag: str) -> tuple[list[Sample], float]:
    """Closed-loop traffic: ``sessions`` coroutines, each sending ``turns`` messages one
    after another. Returns (samples, wall seconds)."""
    probe = RunnerProbe(gw.lanes.runner)
    gw.lanes.runner = probe
    samples: list[Sample] = []
    filler = "Could you summarise where we are and what is left to do today? " * 2

    async def session(i: int) -> None:
        for t in range(turns):
            t0 = time.perf_counter()
            sub = gw.local.submit(f"[{t}] {filler}", to=f"{tag}{i}", channel="bench")
            t1 = time.perf_counter()
            res = await sub.future
            t2 = time.perf_counter()
            if res.status != "ok":
                raise RuntimeError(f"turn failed: {res.status} {res.error}")
            samples.append(Sample(i, t, t0, t1, probe.start.pop(sub.run_id),
                                  probe.end.pop(sub.run_id), t2, res.duration_ms,
                                  res.model_ms))

    w0 = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(sessions)))
    wall = time.perf_counter() - w0
    gw.lanes.runner = probe.runner
    return samples, wall


async def inprocess(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    state = tmp / "inproc"
    loaded = parse_config(bench_config(state, args.cap, args.log_level), "bench", env={})
    devnull = open(os.devnull, "w")
    configure_logging(state_dir=state, level=args.log_level, fmt="json", stream=devnull)
    gw = Gateway(loaded)
    try:
        await gw.start()
        await asyncio.sleep(0.2)
        gc.collect()
        out: dict[str, Any] = {"idle_rss": rss_mb(), "caps": gw.lanes.caps,
                               "timeline": getattr(gw, "recorder", None) is not None}
        await drive(gw, min(args.sessions, 10), 3, "warm")  # imports, first-use caches
        cpu0 = time.process_time()
        samples, wall = await drive(gw, args.sessions, args.turns_per_session, "u")
        out.update(samples=samples, wall=wall, cpu=time.process_time() - cpu0,
                   rss_after=rss_mb())
        if args.long_turns:
            long_samples, _ = await drive(gw, 1, args.long_turns, "long")
            out["long"] = long_samples
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            _, pwall = await drive(gw, args.sessions, args.turns_per_session, "p")
            prof.disable()
            out["profile"] = (prof, args.sessions * args.turns_per_session, pwall)
    finally:
        await gw.stop()
        reset_logging()
        devnull.close()
    return out


def report_inprocess(r: dict[str, Any], args: argparse.Namespace) -> None:
    s: list[Sample] = r["samples"]
    n = len(s)
    over = [x.overhead_ms for x in s]
    warm = [x.overhead_ms for x in s if x.turn > 0]
    tps = n / r["wall"]
    print(f"\n== In-process: {args.sessions} concurrent sessions x {args.turns_per_session} "
          f"turns, echo model, queue followup/debounce 0, lanes.main cap "
          f"{r['caps']['main']}, timeline {'on' if r['timeline'] else 'not wired'} ==")
    row("turns", f"{n} in {r['wall']:.2f} s")
    row("gateway overhead p50 (ms)", f"{pct(over, 50):.3f}", "<= 2 ms",
        verdict(pct(over, 50), TARGETS["overhead_p50_ms"]))
    row("gateway overhead p99 (ms)", f"{pct(over, 99):.3f}", "<= 10 ms",
        verdict(pct(over, 99), TARGETS["overhead_p99_ms"]))
    row("  overhead excl. first turn p50/p99 (ms)",
        f"{pct(warm, 50):.3f} / {pct(warm, 99):.3f}" if warm else "-")
    first = [x.overhead_ms for x in s if x.turn == 0]
    row("  first turn (creates session) p50/p99", f"{pct(first, 50):.3f} / {pct(first, 99):.3f}")
    row("  runner only: duration_ms - model_ms p50/p99",
        f"{pct([x.duration_ms - x.model_ms for x in s], 50):.3f} / "
        f"{pct([x.duration_ms - x.model_ms for x in s], 99):.3f}")
    row("  model_ms (echo) p50", f"{pct([x.model_ms for x in s], 50):.3f}")
    row("turns per second", f"{tps:.0f}", ">= 300/s",
        verdict(tps, TARGETS["turns_per_s"], higher_is_better=True))
    row("process CPU per turn (ms, incl. harness)", f"{r['cpu'] / n * 1000:.3f}")
    print(f"  lane wait (cap queue, not overhead) ms:  {dist([x.lane_wait_ms for x in s])}")
    print(f"  end-to-end per message (submit->reply):  {dist([x.e2e_ms for x in s])}")
    print(f"  resume after turn (settle + loop) ms:    "
          f"{dist([(x.t_done - x.t_end) * 1000 for x in s])}")
    row("RSS in-process idle / after run (MB)", f"{r['idle_rss']:.1f} / {r['rss_after']:.1f}")
    if "long" in r:
        ls: list[Sample] = r["long"]
        k = max(1, min(100, len(ls) // 10))
        head, tail = [x.overhead_ms for x in ls[:k]], [x.overhead_ms for x in ls[-k:]]
        print(f"\n== Session length: 1 session x {len(ls)} turns (cost must not grow) ==")
        row(f"overhead p50 turns 1-{k} (ms)", f"{pct(head, 50):.3f}")
        row(f"overhead p50 last {k} turns (ms)", f"{pct(tail, 50):.3f}", "~ equal",
            "PASS" if pct(tail, 50) <= max(2 * pct(head, 50), pct(head, 50) + 0.3) else "FAIL")


def report_profile(prof: cProfile.Profile, turns: int, wall: float, top: int) -> None:
    """Top functions by own time, and cumulative time of the hot path's main steps, in µs
    per turn (cProfile roughly doubles Python-level cost; compare entries, not totals)."""
    st = pstats.Stats(prof)
    stats: dict = st.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())
    print(f"\n== Profile (cProfile, {turns} turns, {wall:.2f} s wall, profiled CPU "
          f"{total / turns * 1e6:.0f} µs/turn) ==")
    print(f"  {'own µs/turn':>11} {'cum µs/turn':>11} {'calls/turn':>10}  function")
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    for (fname, line, func), (_cc, nc, tt, ct, _callers) in rows:
        print(f"  {tt / turns * 1e6:11.1f} {ct / turns * 1e6:11.1f} {nc / turns:10.1f}  "
              f"{_short(fname)}:{line}({func})")
    print("  -- cumulative, selected steps of the hot path --")
    wanted = [("gateway/local.py", "submit"), ("runtime/lanes.py", "_run_batch"),
              ("gateway/turns.py", "_user_turn"), ("gateway/turns.py", "ensure_session"),
              ("runtime/turn.py", "run"), ("runtime/turn.py", "_loop"),
              ("runtime/model_call.py", "call"), ("runtime/providers/echo.py", "complete"),
              ("runtime/prompt.py", "stable_prefix"), ("runtime/prompt.py", "dynamic_block"),
              ("runtime/prompt.py", "neutralize_user_text"),
              ("runtime/context.py", "fit_to_budget"), ("runtime/context.py", "messages"),
              ("runtime/context.py", "append_message"),
              ("runtime/transcript.py", "append"), ("runtime/events.py", "emit"),
              ("gateway/sessions.py", "touch"), ("gateway/sessions.py", "flush"),
              ("gateway/delivery.py", "typing"), ("runtime/turn.py", "_emit"),
              ("structlog/_native.py", "meth"), ("logging/__init__.py", "handle"),
              ("gateway/logs.py", "__call__"), ("gateway/logs.py", "_render_json")]
    for suffix, func in wanted:
        hits = [(k, v) for k, v in stats.items() if k[0].endswith(suffix) and k[2] == func]
        if hits:
            ct = sum(v[3] for _, v in hits)
            nc = sum(v[1] for _, v in hits)
            print(f"  {ct / turns * 1e6:11.1f} µs cum {nc / turns:6.1f} calls/turn  "
                  f"{suffix}:{func}")


def _short(fname: str) -> str:
    for marker in ("site-packages/", str(ROOT) + "/", "lib/python3.11/"):
        if marker in fname:
            return fname.split(marker, 1)[1]
    return fname


# -- HTTP control API against a real gateway process -------------------------------------

async def http_variant(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Start ``tidegate gateway`` as a process, measure its idle RSS, drive the same
    closed-loop traffic through ``POST /api/agent``, then measure RSS and stop it."""
    state = tmp / "proc"
    cfg_path = tmp / "proc-config.yaml"
    cfg_path.write_text(yaml.safe_dump(bench_config(state, args.cap, args.log_level)))
    env = {k: v for k, v in os.environ.items()
           if k not in ("TIDEGATE_CONFIG", "TIDEGATE_STATE_DIR", "NOTIFY_SOCKET",
                        "WATCHDOG_USEC")}
    err = open(tmp / "proc.stderr", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "gateway", "--config",
                             str(cfg_path)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=err)
    out: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        port = await _wait_ready(proc, state, tmp)
        out["startup_s"] = time.perf_counter() - t0
        await asyncio.sleep(1.0)
        out["idle_rss"] = rss_mb(proc.pid)
        token = (state / "gateway.token").read_text().strip()
        url = f"http://127.0.0.1:{port}/api/agent"
        headers = {"Authorization": f"Bearer {token}"}
        lat: list[float] = []
        filler = "Could you summarise where we are and what is left to do today? " * 2
        conn = aiohttp.TCPConnector(limit=args.sessions + 4)
        async with aiohttp.ClientSession(connector=conn, headers=headers) as http:
            async def session(i: int, turns: int, tag: str, record: bool) -> None:
                for t in range(turns):
                    t1 = time.perf_counter()
                    async with http.post(url, json={"message": f"[{t}] {filler}",
                                                    "to": f"{tag}{i}"}) as resp:
                        body = await resp.json()
                    if resp.status != 200 or body.get("status") != "ok":
                        raise RuntimeError(f"HTTP {resp.status}: {body}")
                    if record:
                        lat.append((time.perf_counter() - t1) * 1000)

            await asyncio.gather(*(session(i, 2, "warm", False)
                                   for i in range(min(10, args.sessions))))
            w0 = time.perf_counter()
            await asyncio.gather(*(session(i, args.turns_per_session, "h", True)
                                   for i in range(args.sessions)))
            out["wall"] = time.perf_counter() - w0
        out["lat"] = lat
        out["rss_after"] = rss_mb(proc.pid)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out["exit"] = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out["exit"] = "killed"
        err.close()
    runner = []
    log_path = state / "logs" / "gateway.jsonl"
    for line in log_path.read_text().splitlines() if log_path.exists() else []:
        ev = json.loads(line)
        if ev.get("event") == "turn_done" and "model_ms" in ev:
            runner.append(ev["duration_ms"] - ev["model_ms"])
    out["runner"] = runner
    return out


async def _wait_ready(proc: subprocess.Popen, state: Path, tmp: Path,
                      timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited {proc.returncode}: "
                                   f"{(tmp / 'proc.stderr').read_text()[-2000:]}")
            try:
                port = json.loads((state / "gateway.json").read_text())["port"]
                async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                    if r.status == 200:
                        return port
            except (OSError, ValueError, KeyError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError("gateway process did not become ready")


def report_http(h: dict[str, Any], args: argparse.Namespace) -> None:
    lat = h["lat"]
    print(f"\n== HTTP control API (POST /api/agent, real `tidegate gateway` process, "
          f"{args.sessions} concurrent clients, keep-alive) ==")
    row("process start -> ready (s)", f"{h['startup_s']:.2f}")
    row("idle gateway RSS, real process (MB)", f"{h['idle_rss']:.1f}", "<= 120 MB",
        verdict(h["idle_rss"], TARGETS["idle_rss_mb"]))
    row("RSS after the HTTP run (MB)", f"{h['rss_after']:.1f}")
    row("turns per second via HTTP", f"{len(lat) / h['wall']:.0f}")
    print(f"  end-to-end incl. HTTP + lane wait (ms):  {dist(lat)}")
    if h["runner"]:
        print(f"  server runner duration-model (log, ms):  {dist(h['runner'])}")
    row("gateway exit code on SIGTERM", str(h["exit"]))


# -- transcript tail ---------------------------------------------------------------------

def write_transcript(path: Path, target_bytes: int) -> tuple[int, float]:
    """Write a realistic transcript (user, assistant tool call, tool result, assistant
    answer per exchange) of about ``target_bytes``. Returns (entries, seconds)."""
    rng = random.Random(7)
    words = ("the of gateway session turn lane model tool file memory heartbeat cron "
             "deploy config error result check note user reply time today build").split()

    def text(n_words: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n_words))

    writer = TranscriptWriter(path, session_id="bench-session", session_key="agent:main:bench",
                              clock=SYSTEM_CLOCK, cwd="/tmp").open()
    t0, ts, n = time.perf_counter(), 1_767_225_600_000, 0
    while os.fstat(writer._fd).st_size < target_bytes:  # noqa: SLF001 - size check only
        ts += 60_000
        call = ToolCall(id=f"call_{n:08x}", name="exec",
                        arguments={"command": f"grep -rn {rng.choice(words)} ."})
        writer.append_message(user_message(text(rng.randint(5, 60)), ts, sender="bench"))
        writer.append_message(assistant_message("", [call], ts + 1000, model="m",
                                                usage={"input": 900, "output": 40}))
        writer.append_message(tool_result_message(call, text(rng.randint(50, 600)), False,
                                                  ts + 2000))
        writer.append_message(assistant_message(text(rng.randint(20, 200)), [], ts + 3000,
                                                model="m", usage={"input": 1400,
                                                                  "output": 200}))
        n += 4
    os.fsync(writer._fd)  # noqa: SLF001 - flushed so its pages can be evicted
    writer.close()
    return n, time.perf_counter() - t0


def evict(path: Path) -> None:
    """Drop the file's pages from the page cache (this file only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def tail_bench(args: argparse.Namespace, tmp: Path, context_tokens: int) -> None:
    path = tmp / "tail" / "bench-session.jsonl"
    entries, secs = write_transcript(path, int(args.transcript_mb * 1024 * 1024))
    size_mb = path.stat().st_size / 1024 / 1024
    max_tokens = context_tokens * 3 // 2  # what gateway/turns.py gives SessionLog

    def session_log_load() -> tuple[float, int]:
        t = time.perf_counter()
        msgs = SessionLog(path, session_id="bench-session", session_key="agent:main:bench",
                          clock=SYSTEM_CLOCK, max_tokens=max_tokens).messages()
        return (time.perf_counter() - t) * 1000, len(msgs)

    def timed(fn: Any, cold: bool, reps: int = 7) -> tuple[list[float], Any]:
        times, last = [], None
        for _ in range(reps):
            if cold:
                evict(path)
            t = time.perf_counter()
            last = fn()
            times.append((time.perf_counter() - t) * 1000)
        return times, last

    print(f"\n== Transcript tail: {size_mb:.1f} MB, {entries} entries (written in "
          f"{secs:.1f} s) ==")
    warm, (_, n_msgs) = timed(session_log_load, cold=False)
    cold, _ = timed(session_log_load, cold=True)
    med = statistics.median(warm)
    row("SessionLog.messages() warm cache median (ms)", f"{med:.2f}", "<= 50 ms",
        verdict(med, TARGETS["tail_ms"]))
    row("SessionLog.messages() evicted median/max", f"{statistics.median(cold):.2f} / "
        f"{max(cold):.2f}", "<= 50 ms", verdict(max(cold), TARGETS["tail_ms"]))
    row("  messages in the tail (max_tokens)", f"{n_msgs} ({max_tokens})")
    rt, res = timed(lambda: read_tail(path), cold=False)
    row("read_tail(4 MB window) warm median (ms)", f"{statistics.median(rt):.2f}", "<= 50 ms",
        verdict(statistics.median(rt), TARGETS["tail_ms"]))
    rtc, _ = timed(lambda: read_tail(path), cold=True)
    row("read_tail(4 MB window) evicted median", f"{statistics.median(rtc):.2f}")
    row("  entries in the 4 MB window", str(len(res.entries)))
    t = time.perf_counter()
    with open(path, "rb") as fh:
        full = sum(1 for line in fh if json.loads(line))
    row("reference: parse the whole file (ms)", f"{(time.perf_counter() - t) * 1000:.0f}"
        f" ({full} lines)")


# -- main --------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=100, help="concurrent sessions (100)")
    p.add_argument("--turns-per-session", type=int, default=20, help="turns each (20)")
    p.add_argument("--transcript-mb", type=float, default=100, help="transcript size (100)")
    p.add_argument("--cap", type=int, default=None,
                   help="override lanes.main (default: the config default, 4)")
    p.add_argument("--log-level", default="info", help="gateway log level (info)")
    p.add_argument("--long-turns", type=int, default=2000,
                   help="turns for the session-length check (0: skip)")
    p.add_argument("--profile", action="store_true", help="also profile a run (cProfile)")
    p.add_argument("--profile-top", type=int, default=30)
    p.add_argument("--no-http", action="store_true", help="skip the HTTP process variant")
    p.add_argument("--no-tail", action="store_true", help="skip the transcript tail bench")
    p.add_argument("--keep", action="store_true", help="keep the temp dir and print it")
    a = p.parse_args(argv)
    if a.sessions < 1 or a.turns_per_session < 1 or a.transcript_mb <= 0:
        p.error("--sessions and --turns-per-session must be >= 1, --transcript-mb > 0")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tidegate-bench-"))
    load = os.getloadavg()
    print(f"tidegate gateway bench — Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load avg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    try:
        r = asyncio.run(inprocess(args, tmp))
        report_inprocess(r, args)
        if "profile" in r:
            report_profile(*r["profile"], top=args.profile_top)
        if not args.no_http:
            report_http(asyncio.run(http_variant(args, tmp)), args)
        if not args.no_tail:
            from gateway.config import AgentSettings
            tail_bench(args, tmp, AgentSettings().context_tokens)
        load = os.getloadavg()
        print(f"\nload avg after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
