"""The gateway benchmark's HTTP variant: a real ``tidegate gateway`` process, driven through
the control API (``POST /api/agent``, issue 2 §4/§9) by an aiohttp client.

Used by ``gateway_bench.py`` (``--no-http`` skips it). Measures the idle RSS of the real
daemon after READY (the in-process figure includes the benchmark harness), end-to-end
latency per message including HTTP and the lane wait, turns/s, RSS after the run, and the
server's own ``turn_done`` figures (``duration_ms - model_ms``) read back from
``<state_dir>/logs/gateway.jsonl``. The gateway is stopped with SIGTERM; its exit code is
reported (issue 2 expects 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from gateway_bench_common import (
    FILLER,
    ROOT,
    TARGETS,
    bench_config,
    dist,
    row,
    rss_mb,
    seed_sessions,
    verdict,
)


def start_gateway_process(cfg_path: Path, stderr_path: Path) -> subprocess.Popen:
    """``python -m gateway.cli gateway --config cfg_path`` with stderr to a file (JSON lines,
    as under systemd). Environment variables that would redirect it are dropped."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TIDEGATE_CONFIG", "TIDEGATE_STATE_DIR", "NOTIFY_SOCKET",
                        "WATCHDOG_USEC")}
    with open(stderr_path, "wb") as err:  # the child keeps its own copy of the fd
        return subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "gateway", "--config", str(cfg_path)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)


async def wait_ready(proc: subprocess.Popen, state: Path, stderr_path: Path,
                     timeout: float = 30.0) -> int:
    """Poll ``gateway.json`` + ``GET /readyz`` until 200; returns the port. Raises
    RuntimeError if the process exits, TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited {proc.returncode}: "
                                   f"{stderr_path.read_text()[-2000:]}")
            try:
                port = json.loads((state / "gateway.json").read_text())["port"]
                async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                    if r.status == 200:
                        return port
            except (OSError, ValueError, KeyError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError("gateway process did not become ready")


async def run_http(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Start the process, measure idle RSS, drive ``args.sessions`` closed-loop clients x
    ``args.turns_per_session`` messages, measure RSS, stop it. Returns the raw figures:
    ``startup_s``, ``idle_rss``, ``wall``, ``lat`` (ms list), ``rss_after``, ``exit``,
    ``runner`` (server-side duration-model ms list)."""
    state = tmp / "proc"
    cfg_path, stderr_path = tmp / "proc-config.yaml", tmp / "proc.stderr"
    seed_sessions(state, args.stored_sessions)
    cfg_path.write_text(yaml.safe_dump(bench_config(state, args)))
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    proc = start_gateway_process(cfg_path, stderr_path)
    try:
        port = await wait_ready(proc, state, stderr_path)
        out["startup_s"] = time.perf_counter() - t0
        await asyncio.sleep(1.0)  # let start-up garbage settle before reading RSS
        out["idle_rss"] = rss_mb(proc.pid)
        token = (state / "gateway.token").read_text().strip()
        out["wall"], out["lat"] = await _drive(args, port, token)
        out["rss_after"] = rss_mb(proc.pid)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        out["exit"] = await _wait_exit(proc, 30.0)
    runner = []
    log_path = state / "logs" / "gateway.jsonl"
    for line in log_path.read_text().splitlines() if log_path.exists() else []:
        ev = json.loads(line)
        if ev.get("event") == "turn_done" and "model_ms" in ev:
            runner.append(ev["duration_ms"] - ev["model_ms"])
    out["runner"] = runner
    return out


async def _drive(args: argparse.Namespace, port: int, token: str) -> tuple[float, list[float]]:
    url = f"http://127.0.0.1:{port}/api/agent"
    lat: list[float] = []
    conn = aiohttp.TCPConnector(limit=args.sessions + 4)
    async with aiohttp.ClientSession(connector=conn,
                                     headers={"Authorization": f"Bearer {token}"}) as http:
        async def session(i: int, turns: int, tag: str, record: bool) -> None:
            for t in range(turns):
                t1 = time.perf_counter()
                async with http.post(url, json={"message": f"[{t}] {FILLER}",
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
        return time.perf_counter() - w0, lat


async def _wait_exit(proc: subprocess.Popen, timeout: float) -> int | str:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        return "killed after timeout"
    return proc.returncode


def report_http(h: dict[str, Any], args: argparse.Namespace) -> None:
    """Print the HTTP variant's figures with targets."""
    lat = h["lat"]
    print(f"\n== HTTP control API: POST /api/agent to a real `tidegate gateway` process, "
          f"{args.sessions} concurrent clients (keep-alive) x {args.turns_per_session} ==")
    row("process start -> ready (s)", f"{h['startup_s']:.2f}")
    row("idle gateway RSS, real process (MB)", f"{h['idle_rss']:.1f}", "<= 120 MB",
        verdict(h["idle_rss"], TARGETS["idle_rss_mb"]))
    row("RSS after the HTTP run (MB)", f"{h['rss_after']:.1f}")
    row("turns per second via HTTP", f"{len(lat) / h['wall']:.0f}")
    print(f"  end-to-end incl. HTTP + lane wait (ms):  {dist(lat)}")
    if h["runner"]:
        print(f"  server: duration_ms - model_ms (log):   {dist(h['runner'])}")
    row("gateway exit code on SIGTERM", str(h["exit"]))
