"""Operator-facing latency (issue 14 "bench/"), against a real ``tidegate gateway`` process:

1. **webchat first byte**: a streamed reply's first delta reaches the webchat WebSocket
   client within **100 ms** of the model's first token. The model is a small SSE server in
   this process that writes the first content chunk, notes ``time.monotonic()`` (one
   system-wide clock on Linux, shared with the client), then waits 300 ms before the rest.
2. **``tidegate agent -m`` round trip**: a new ``tidegate agent -m hi`` process per message
   (interpreter start, imports, config load, the control API call, the turn, the reply)
   against the built-in echo model; target **p50 ≤ 500 ms** on this machine (most of it is
   starting Python).

Run: ``.venv/bin/python bench/operator_bench.py [--n 20]``. Prints each figure with its
target and PASS/FAIL; exit 0 when all pass.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
FIRST_BYTE_TARGET_MS = 100.0
ROUND_TRIP_TARGET_MS = 500.0


class StreamingModel:
    """OpenAI-style ``/v1/chat/completions`` SSE: first token, a pause, the rest."""

    def __init__(self) -> None:
        self.first_token_at: list[float] = []

    async def handler(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(delta: dict | None, finish: str | None = None) -> None:
            chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0,
                     "model": body.get("model"), "choices": [] if delta is None else
                     [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if delta is None:
                chunk["usage"] = {"prompt_tokens": 10, "completion_tokens": 3,
                                  "total_tokens": 13}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        await send({"role": "assistant", "content": ""})
        await send({"content": "First"})
        self.first_token_at.append(time.monotonic())
        await asyncio.sleep(0.3)
        await send({"content": " and the rest."})
        await send({}, finish="stop")
        await send(None)
        await resp.write(b"data: [DONE]\n\n")
        return resp


def start_gateway(tmp: Path, cfg: dict) -> tuple[subprocess.Popen, Path]:
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "gateway", "--config",
                             str(path)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    state = Path(cfg["gateway"]["state_dir"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            port = json.loads((state / "gateway.json").read_text())["port"]
            import urllib.request
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                return proc, path
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.05)
    raise TimeoutError("gateway did not start")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


async def first_byte(n: int, tmp: Path) -> list[float]:
    model = StreamingModel()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", model.handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    mport = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state = tmp / "fb"
    cfg = {"gateway": {"state_dir": str(state), "port": 0},
           "models": {"providers": {"m": {"api": "openai", "api_key": "sk-bench-000000",
                                          "base_url": f"http://127.0.0.1:{mport}/v1"}},
                      "retries": 0},
           "agents": {"defaults": {"model": "m/bench"}},
           "messages": {"queue": {"mode": "followup", "debounce": 0}}}
    proc, _ = await asyncio.to_thread(start_gateway, tmp, cfg)
    gaps = []
    try:
        port = json.loads((state / "gateway.json").read_text())["port"]
        token = (state / "gateway.token").read_text().strip()
        async with aiohttp.ClientSession() as http, http.ws_connect(
                f"http://127.0.0.1:{port}/ws?token={token}&client=bench") as ws:
            await ws.receive_json()  # ready
            for i in range(n):
                await ws.send_json({"type": "message", "text": f"hello {i}"})
                got_first = None
                while True:
                    msg = await ws.receive_json()
                    if msg["type"] == "delta" and got_first is None and msg["text"]:
                        got_first = time.monotonic()
                    if msg["type"] in ("reply", "error"):
                        break
                gaps.append((got_first - model.first_token_at[-1]) * 1000)
    finally:
        await asyncio.to_thread(stop, proc)
        await runner.cleanup()
    return gaps


def round_trips(n: int, tmp: Path) -> tuple[list[float], list[float]]:
    """Wall ms per ``agent -m`` and the CLI process's own CPU ms (user + sys), which does
    not depend on how busy the machine is."""
    import resource
    state = tmp / "rt"
    cfg = {"gateway": {"state_dir": str(state), "port": 0},
           "messages": {"queue": {"mode": "followup", "debounce": 0}}}
    proc, path = start_gateway(tmp, cfg)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    out, cpu = [], []
    try:
        for i in range(n):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "gateway.cli", "--config", str(path),
                                "agent", "-m", f"ping {i}", "-q"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=60)
            out.append((time.perf_counter() - t0) * 1000)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
                       * 1000)
            if r.returncode != 0:
                raise RuntimeError(r.stderr)
    finally:
        stop(proc)
    return out, cpu


def report(name: str, values: list[float], target: float, stat: str) -> bool:
    p50 = statistics.median(values)
    p95 = sorted(values)[max(0, int(len(values) * 0.95) - 1)]
    judged = p50 if stat == "p50" else p95
    ok = judged <= target
    print(f"{name}: p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {max(values):.1f} ms "
          f"(n={len(values)}); target {stat} <= {target:g} ms: {'PASS' if ok else 'FAIL'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="messages per measurement")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tg-opbench-") as d:
        tmp = Path(d)
        fb = asyncio.run(first_byte(args.n, tmp))
        rt, cpu = round_trips(args.n, tmp)
    ok = report("webchat first byte after the model's first token", fb,
                FIRST_BYTE_TARGET_MS, "p95")
    ok &= report("tidegate agent -m round trip (echo model, CLI start included)", rt,
                 ROUND_TRIP_TARGET_MS, "p50")
    print(f"  CLI process CPU per call (load-independent): p50 {statistics.median(cpu):.0f} "
          f"ms; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
