"""Gateway benchmark (issue 2, "How it is proven", last bullet; DESIGN.md "Performance").

Run: ``.venv/bin/python bench/gateway_bench.py [--sessions 100] [--turns-per-session 20]
[--transcript-mb 100] [--profile] [--no-http] [--no-tail] [--long-turns 2000]
[--stored-sessions 0] [--timeline on|off] [--cap N] [--log-level info]``

Drives N concurrent sessions through the real ``gateway.service.daemon.Gateway`` (in-process, built
with ``parse_config``) with the built-in zero-latency ``echo`` provider (no model configured
= ``echo/diagnostic``) and prints figures next to the targets, PASS/FAIL:

- gateway overhead per turn, p50/p99 [<= 2 ms / <= 10 ms at 100 concurrent sessions]:
  intake (``gw.local.submit``: routing, lane enqueue) plus the lane runner (session lookup
  or creation, context, prompt, the turn, transcript appends, store touch, logging,
  delivery) minus the model's time (``TurnResult.model_ms``). The wait for a lane slot
  under the global cap (``lanes.main``, default 32) is not overhead and is reported on its
  own, as is the end-to-end time per message (submit -> future resolved). All turns, and
  steady state (without each session's first turn, which creates the session).
- turns per second [>= 300/s], counting until the async timeline writer has drained;
  process CPU per turn (DESIGN.md compares CPU per turn with nanobot and hermes-agent).
- RSS [idle <= 120 MB]: the real ``tidegate gateway`` process after READY (HTTP variant;
  the in-process figure includes this harness) and after the run.
- the same traffic through the HTTP control API (``POST /api/agent``) to the real process:
  end-to-end latency including HTTP (``gateway_bench_http.py``).
- loading the tail of a 100 MB transcript [<= 50 ms] (``transcript_tail_bench.py``).
- ``--long-turns``: one session for many turns; the cost of a turn must not grow with the
  session's length (DESIGN.md "Performance").
- ``--profile``: the in-process run again under cProfile; top costs in µs per turn.

Traffic is closed-loop: each session sends its next message when the reply to the previous
one arrived. Queue mode ``followup`` with debounce 0: every message is its own turn (no
batching), the throughput setting. Logging is configured as the daemon configures it (JSON
lines to ``<state_dir>/logs/gateway.jsonl`` and to stderr — here /dev/null). Everything
lives in a temp dir. A script that prints figures, not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gateway_bench_common import (
    FILLER,
    ROOT,
    TARGETS,
    bench_config,
    dist,
    pct,
    row,
    rss_mb,
    seed_sessions,
    verdict,
)

from gateway.config.load import parse_config
from gateway.logs.pipeline import configure_logging, reset_logging
from gateway.service.daemon import Gateway


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
    runner_cpu_ms: float

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
    a turn gets its lane slot and when it returns, and the main thread's CPU time between
    (wall minus that = time the loop thread was stalled or ran other tasks). Costs ~2 µs."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    async def __call__(self, key: str, payloads: list[Any], control: Any) -> Any:
        run_id = payloads[0].run_id
        c0 = time.thread_time()
        self.start[run_id] = time.perf_counter()
        try:
            return await self.runner(key, payloads, control)
        finally:
            self.end[run_id] = time.perf_counter()
            self.cpu[run_id] = (time.thread_time() - c0) * 1000


async def drive(gw: Gateway, sessions: int, turns: int, tag: str) -> tuple[list[Sample], float]:
    """Closed-loop traffic: ``sessions`` coroutines, each sending ``turns`` messages one
    after another. Returns (samples, wall seconds)."""
    probe = RunnerProbe(gw.lanes.runner)
    gw.lanes.runner = probe
    samples: list[Sample] = []
    async def session(i: int) -> None:
        for t in range(turns):
            t0 = time.perf_counter()
            sub = gw.local.submit(f"[{t}] {FILLER}", to=f"{tag}{i}", channel="bench")
            t1 = time.perf_counter()
            res = await sub.future
            t2 = time.perf_counter()
            if res.status != "ok":
                raise RuntimeError(f"turn failed: {res.status} {res.error}")
            samples.append(Sample(i, t, t0, t1, probe.start.pop(sub.run_id),
                                  probe.end.pop(sub.run_id), t2, res.duration_ms,
                                  res.model_ms, probe.cpu.pop(sub.run_id)))

    w0 = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(sessions)))
    wall = time.perf_counter() - w0
    gw.lanes.runner = probe.runner
    return samples, wall


async def inprocess(args: argparse.Namespace, tmp: Path, stderr: TextIO) -> dict[str, Any]:
    """Start a Gateway in this loop, warm it up, run the closed-loop traffic (and the
    session-length check and the profiled run when asked), stop it. Returns raw figures:
    ``samples``, ``wall``/``drain``/``cpu`` seconds, ``idle_rss``/``rss_after`` MB,
    ``caps``, ``timeline``, optionally ``long`` and ``profile``."""
    state = tmp / "inproc"
    seed_sessions(state, args.stored_sessions)
    loaded = parse_config(bench_config(state, args), "bench", env={})
    configure_logging(state_dir=state, level=args.log_level, fmt="json", stream=stderr)
    gw = Gateway(loaded)
    try:
        await gw.start()
        await asyncio.sleep(0.2)
        gc.collect()
        hooks = getattr(gw, "timeline_hooks", None)  # background timeline writer, if wired
        out: dict[str, Any] = {"idle_rss": rss_mb(), "caps": gw.lanes.caps,
                               "timeline": getattr(gw, "recorder", None) is not None}
        await drive(gw, min(args.sessions, 10), 3, "warm")  # imports, first-use caches
        if hooks is not None:
            await hooks.flush()
        cpu0 = time.process_time()
        samples, wall = await drive(gw, args.sessions, args.turns_per_session, "u")
        t = time.perf_counter()
        if hooks is not None:  # recording is async: the backlog is part of the work
            await hooks.flush()
        out.update(samples=samples, wall=wall, drain=time.perf_counter() - t,
                   cpu=time.process_time() - cpu0, rss_after=rss_mb())
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
    return out


def report_inprocess(r: dict[str, Any], args: argparse.Namespace) -> None:
    s: list[Sample] = r["samples"]
    n = len(s)
    over = [x.overhead_ms for x in s]
    warm = [x.overhead_ms for x in s if x.turn > 0]
    tps = n / r["wall"]
    print(f"\n== In-process: {args.sessions} concurrent sessions x {args.turns_per_session} "
          f"turns, echo model, queue followup/debounce 0, lanes.main cap "
          f"{r['caps']['main']}, timeline {'on' if r['timeline'] else 'off'}, log level "
          f"{args.log_level}, {args.stored_sessions} stored sessions ==")
    row("turns", f"{n} in {r['wall']:.2f} s")
    row("gateway overhead p50 (ms)", f"{pct(over, 50):.3f}", "<= 2 ms",
        verdict(pct(over, 50), TARGETS["overhead_p50_ms"]))
    row("gateway overhead p99 (ms), all turns", f"{pct(over, 99):.3f}", "<= 10 ms",
        verdict(pct(over, 99), TARGETS["overhead_p99_ms"]))
    if warm:
        row("  steady state (excl. first turn) p50/p99", f"{pct(warm, 50):.3f} / "
            f"{pct(warm, 99):.3f}", "<= 10 ms", verdict(pct(warm, 99),
                                                         TARGETS["overhead_p99_ms"]))
    first = [x.overhead_ms for x in s if x.turn == 0]
    row("  first turn (creates session) p50/p99", f"{pct(first, 50):.3f} / {pct(first, 99):.3f}")
    runner = [x.duration_ms - x.model_ms for x in s]
    row("  runner only: duration_ms - model_ms p50/p99",
        f"{pct(runner, 50):.3f} / {pct(runner, 99):.3f}")
    row("  model_ms (echo) p50", f"{pct([x.model_ms for x in s], 50):.3f}")
    stall = [(x.t_end - x.t_start) * 1000 - x.runner_cpu_ms for x in s if x.turn > 0]
    if stall:
        row("  steady: runner wall - loop-thread CPU p99", f"{pct(stall, 99):.3f}")
    tps_all = n / (r["wall"] + r["drain"])
    row("turns per second (incl. timeline drain)", f"{tps_all:.0f}", ">= 300/s",
        verdict(tps_all, TARGETS["turns_per_s"], higher_is_better=True))
    row("  replies per second / timeline drain after", f"{tps:.0f} / {r['drain'] * 1000:.0f} ms")
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
    by_module: dict[str, float] = {}
    for (fname, _line, _func), v in stats.items():
        mod = _module(fname)
        by_module[mod] = by_module.get(mod, 0.0) + v[2]
    print("  -- own time by module (µs/turn) --")
    for mod, tt in sorted(by_module.items(), key=lambda kv: kv[1], reverse=True)[:top // 2]:
        print(f"  {tt / turns * 1e6:11.1f}  {mod}")
    print("  -- cumulative, selected steps of the hot path --")
    wanted = [("gateway/channels/local.py", "submit"), ("runtime/lanes.py", "_run_batch"),
              ("gateway/turns/executor.py", "_user_turn"), ("gateway/turns/executor.py", "ensure_session"),
              ("runtime/turn/runner.py", "run"), ("runtime/turn/runner.py", "_loop"),
              ("runtime/providers/failover/chain.py", "call"), ("runtime/providers/echo.py", "complete"),
              ("runtime/prompt.py", "stable_prefix"), ("runtime/prompt.py", "dynamic_block"),
              ("runtime/prompt.py", "neutralize_user_text"),
              ("runtime/context/budget.py", "fit_to_budget"),
              ("runtime/context/session_log.py", "messages"),
              ("runtime/context/session_log.py", "append_message"),
              ("runtime/transcript.py", "append"), ("runtime/events.py", "emit"),
              ("gateway/sessions/store.py", "touch"), ("gateway/sessions/store.py", "flush"),
              ("gateway/sessions/store.py", "to_json"), ("gateway/timeline_hooks.py", "record"),
              ("gateway/timeline_hooks.py", "_run"), ("gateway/timeline_hooks.py", "_write"),
              ("gateway/outbound/delivery.py", "typing"), ("runtime/turn/runner.py", "emit"),
              ("structlog/_native.py", "meth"), ("logging/__init__.py", "handle"),
              ("gateway/logs/pipeline.py", "__call__"), ("gateway/logs/pipeline.py", "_render_json")]
    for suffix, func in wanted:
        hits = [(k, v) for k, v in stats.items() if k[0].endswith(suffix) and k[2] == func]
        if hits:
            ct = sum(v[3] for _, v in hits)
            nc = sum(v[1] for _, v in hits)
            print(f"  {ct / turns * 1e6:11.1f} µs cum {nc / turns:6.1f} calls/turn  "
                  f"{suffix}:{func}")


def _module(fname: str) -> str:
    """Group a profiled file: our files by path, libraries by top-level package."""
    short = _short(fname)
    if fname.startswith(str(ROOT) + "/"):
        return short
    if short.startswith(("~", "<")):
        return "builtins (C)"
    return short.split("/", 1)[0].removesuffix(".py")


def _short(fname: str) -> str:
    for marker in ("site-packages/", str(ROOT) + "/", "lib/python3.11/"):
        if marker in fname:
            return fname.split(marker, 1)[1]
    return fname


# -- HTTP control API against a real gateway process -------------------------------------

# -- main --------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line; errors exit 2 with a message (argparse)."""
    p = argparse.ArgumentParser(description="tidegate gateway benchmark (issue 2 targets)",
                                epilog="See the module docstring and bench/README.md.")
    p.add_argument("--sessions", type=int, default=100, help="concurrent sessions (100)")
    p.add_argument("--turns-per-session", type=int, default=20, help="turns each (20)")
    p.add_argument("--transcript-mb", type=float, default=100,
                   help="size of the transcript for the tail benchmark (100)")
    p.add_argument("--cap", type=int, default=None,
                   help="lanes.main override (default: the config default, 4)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning",
                                                            "error"), help="(info)")
    p.add_argument("--timeline", choices=("on", "off"), default="on",
                   help="timeline.enabled (on, the config default)")
    p.add_argument("--stored-sessions", type=int, default=0,
                   help="old sessions pre-seeded into sessions.json (0)")
    p.add_argument("--long-turns", type=int, default=2000,
                   help="turns of the session-length check (2000; 0 skips it)")
    p.add_argument("--profile", action="store_true", help="also profile a run (cProfile)")
    p.add_argument("--profile-top", type=int, default=30, help="rows of the profile (30)")
    p.add_argument("--no-http", action="store_true", help="skip the HTTP/process variant")
    p.add_argument("--no-tail", action="store_true", help="skip the transcript tail bench")
    p.add_argument("--keep", action="store_true", help="keep the temp dir and print it")
    a = p.parse_args(argv)
    if a.sessions < 1 or a.turns_per_session < 1 or a.transcript_mb <= 0 \
            or a.long_turns < 0 or a.stored_sessions < 0 or (a.cap is not None and a.cap < 1):
        p.error("--sessions, --turns-per-session, --cap must be >= 1; --transcript-mb > 0; "
                "--long-turns, --stored-sessions >= 0")
    return a


def main(argv: list[str] | None = None) -> int:
    """Run every part; returns 0 (figures are printed, not asserted)."""
    from gateway_bench_http import report_http, run_http
    from transcript_tail_bench import tail_bench

    from gateway.config.agents import AgentSettings

    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tidegate-bench-"))
    load = os.getloadavg()
    print(f"tidegate gateway bench — Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load avg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    try:
        with open(os.devnull, "w") as devnull:
            r = asyncio.run(inprocess(args, tmp, devnull))
        report_inprocess(r, args)
        if "profile" in r:
            report_profile(*r["profile"], top=args.profile_top)
        if not args.no_http:
            report_http(asyncio.run(run_http(args, tmp)), args)
        if not args.no_tail:
            tail_bench(args.transcript_mb, tmp, AgentSettings().context_tokens)
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
