"""Shared pieces of the gateway benchmarks (``gateway_bench.py``, ``gateway_bench_http.py``,
``transcript_tail_bench.py``): targets, percentiles, table rows, RSS, the bench config.

Targets come from issue 2 ("How it is proven", last bullet) and DESIGN.md "Performance".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGETS = {"overhead_p50_ms": 2.0, "overhead_p99_ms": 10.0, "turns_per_s": 300.0,
           "tail_ms": 50.0, "idle_rss_mb": 120.0}
FILLER = "Could you summarise where we are and what is left to do today? " * 2


def rss_mb(pid: int | str = "self") -> float:
    """Resident set size of a process in MB (VmRSS from /proc; Linux only)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def verdict(value: float, target: float, higher_is_better: bool = False) -> str:
    """"PASS" or "FAIL" of ``value`` against ``target``."""
    ok = value >= target if higher_is_better else value <= target
    return "PASS" if ok else "FAIL"


def row(label: str, value: str, target: str = "", result: str = "") -> None:
    """Print one aligned result line: label, value, target, PASS/FAIL."""
    print(f"  {label:<46} {value:>22}  {target:<10} {result}".rstrip())


def dist(values: list[float]) -> str:
    """``p50 .. p99 .. max ..`` of milliseconds."""
    if not values:
        return "-"
    return f"p50 {pct(values, 50):.3f}  p99 {pct(values, 99):.3f}  max {max(values):.3f}"


def bench_config(state_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The gateway config the benchmarks run: no model configured (built-in ``echo``
    provider), queue ``followup`` with debounce 0, any free port, webchat on; ``--cap``,
    ``--timeline`` and ``--log-level`` from the command line."""
    cfg: dict[str, Any] = {
        "gateway": {"state_dir": str(state_dir), "port": 0, "shutdown_grace": "10s"},
        "logging": {"level": args.log_level, "format": "json"},
        "messages": {"queue": {"mode": "followup", "debounce": 0}},
    }
    if args.cap is not None:
        cfg["lanes"] = {"main": args.cap}
    if args.timeline == "off":
        cfg["timeline"] = {"enabled": False}
    return cfg


def seed_sessions(state_dir: Path, count: int) -> None:
    """Pre-populate ``agents/main/sessions/sessions.json`` (the format documented in
    ``gateway/sessions/store.py``) with ``count`` old sessions, as a gateway that has run for a
    while has. No-op for ``count <= 0``."""
    if count <= 0:
        return
    path = state_dir / "agents" / "main" / "sessions" / "sessions.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    ts = "2026-01-01T00:00:00.000Z"
    sessions = {f"agent:main:telegram:dm:{100000 + i}": {
        "session_id": f"00000000-0000-4000-8000-{i:012d}", "agent": "main",
        "created_at": ts, "updated_at": ts, "last_active_at": ts,
        "last_route": {"channel": "telegram", "account": "default", "to": str(100000 + i),
                       "thread": None},
        "counters": {"turns": 12, "messages_in": 12, "input_tokens": 9000,
                     "output_tokens": 1500}} for i in range(count)}
    path.write_text(json.dumps({"version": 1, "sessions": sessions}))
