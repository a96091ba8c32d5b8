"""One checker run: start the cluster, run the generator and the nemesis side by side for
``duration`` seconds, heal, wait for the replies to settle, collect the history, check.

``run(seed=..., duration=..., replicas=..., faults=[...])`` returns a :class:`Result`;
``report(result)`` renders it (seed, operations, faults injected, anomalies by kind with
examples). The same seed gives the same plan of messages and faults.
"""

from __future__ import annotations

import json
import logging
import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.clock import parse_iso
from tests.cluster_check import checker, generator, nemesis
from tests.cluster_check.cluster import CHAT0, Cluster


@dataclass
class Result:
    seed: int
    history: checker.History
    anomalies: dict[str, list[str]]
    took: float
    settle: float


def _settled(cluster: Cluster, ops: list[generator.Op], replicas_calls: int) -> bool:
    want = {op.id for op in ops if op.surface == "telegram" and op.status == "sent"}
    got = set()
    for m in cluster.bot.call(cluster.bot.fake.bot_messages):
        got.update(generator.message_ids_of(m.get("text", "")))
    return want <= got


def _outcomes(cluster: Cluster) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for p in cluster.replicas.values():
        r = p.cli("sessions", "outcomes", "--json", "-n", "0", check=False, timeout=60)
        try:
            rows = json.loads(r.stdout)
        except ValueError:
            continue
        for row in rows:
            k = (str(row.get("session_key")), str(row.get("message_id")))
            out.setdefault(k, []).append(checker.outcome_of(row))
    return out


def collect(cluster: Cluster, ops, faults, t0: float, down: list[str]) -> checker.History:
    end = time.time()
    calls = list(cluster.model.server.calls)  # before the cron rows: each call's row exists
    sent = cluster.bot.call(lambda: [dict(s) for s in cluster.bot.fake.sent])
    chats: dict[int, list[dict[str, Any]]] = {}
    for s in sent:
        if s["method"].lower() == "sendmessage" and s["status"] == 200:
            chats.setdefault(int(s["payload"]["chat_id"]), []).append(
                {"text": str(s["payload"].get("text", "")), "time": s["time"]})
    cron = [(float(d), st, int(a)) for d, st, a in cluster.rows(
        "SELECT due_at, state, attempts FROM cluster_cron_runs ORDER BY due_at")]
    skipped, runs = [], []
    for line in cluster.sql("SELECT record FROM cron_runs").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not rec.get("due_at") or rec.get("manual"):
            continue
        if rec.get("status") == "skipped" and "still in progress" in str(rec.get("error")):
            skipped.append(parse_iso(rec["due_at"]))
        elif rec.get("started_at") and rec.get("finished_at"):
            runs.append((parse_iso(rec["due_at"]), parse_iso(rec["started_at"]),
                         parse_iso(rec["finished_at"])))
    verify = cluster.any_live().cli("timeline", "verify", check=False, timeout=120)
    return checker.History(
        ops=ops, calls=calls, faults=faults, chats=chats,
        timelines=[tuple(r) for r in cluster.rows(
            "SELECT session_key, session_id FROM timelines WHERE session_key LIKE "
            f"'agent:main:dm:{str(CHAT0)[:2]}%'")],
        sessions=[tuple(r) for r in cluster.rows(
            "SELECT session_key, session_id FROM sessions WHERE session_key LIKE "
            f"'agent:main:dm:{str(CHAT0)[:2]}%'")],
        outcomes={}, cron_rows=cron, cron_every=cluster.cron_every, cron_skipped=skipped,
        cron_runs=runs,
        verify=(verify.returncode, verify.stdout + verify.stderr), down=down, start=t0,
        end=end)


def run(*, seed: int, duration: float, replicas: int = 3, faults: list[str] | None = None,
        sessions: int = 6, rate: float = 3.0, ttl: float = 3.0, latency: float = 0.05,
        cron_every: float = 5.0, settle: float = 60.0, tmp: Path | None = None,
        surfaces: dict[str, float] | None = None, log=print, pg=None, revive: bool = True,
        first_fault: float = 3.0, linger: float = 2.0) -> Result:
    """One run (see the module docstring); ``log`` gets progress lines. ``pg``: a running
    PostgreSQL server to use (tests/pg_server.py; no ``pg`` fault then); ``revive=False``
    leaves killed replicas down (a shorter run); ``first_fault``: the earliest offset of
    the first fault (s); ``linger``: how long to wait for late duplicates after the
    replies settled (s)."""
    if pg is not None and "pg" in (faults or nemesis.KINDS):
        raise ValueError("the pg fault stops PostgreSQL: it needs a private server")
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # a killed client's
    # half-written model response is expected here, not news
    rng = random.Random(seed)
    names = [f"r{i + 1}" for i in range(replicas)]
    ops = generator.plan(rng, duration, names, sessions=sessions, rate=rate,
                         surfaces=surfaces)
    kinds = list(nemesis.KINDS if faults is None else faults)
    schedule = nemesis.plan(rng, duration - 2, names, kinds, ttl, first=first_fault)
    tmp = tmp or Path(tempfile.mkdtemp(prefix="tidegate-checker-"))
    cluster = Cluster(tmp, replicas, ttl=ttl, latency=latency, cron_every=cron_every, pg=pg)
    started = time.time()
    try:
        cluster.start()
        log(f"seed {seed}: {len(ops)} messages, {len(schedule)} faults planned over "
            f"{duration:g}s on {replicas} replicas (boot {time.time() - started:.1f}s)")
        stop = threading.Event()
        t0 = time.time()
        nem = threading.Thread(target=nemesis.run, args=(cluster, schedule, t0, stop,
                                                         revive), name="nemesis")
        nem.start()
        generator.run_plan(cluster, ops, t0, stop)
        stop.set()
        nem.join()
        down = cluster.heal(revive)
        healed = time.time()
        deadline = healed + settle
        while time.time() < deadline and not _settled(cluster, ops, 0):
            time.sleep(0.5)
        time.sleep(min(linger, ttl))  # a late duplicate would show now
        history = collect(cluster, ops, schedule, t0, down)
        anomalies = checker.check(history)
        if "lost-reply" in anomalies:
            history.outcomes = _outcomes(cluster)
            anomalies = checker.check(history)
        return Result(seed, history, anomalies, time.time() - t0, time.time() - healed)
    finally:
        cluster.close()


def report(r: Result, examples: int = 3) -> str:
    """The human report of a run."""
    s = checker.summary(r.history)
    lines = [(f"seed {r.seed}: {len(r.history.ops)} operations in {r.took:.0f}s "
              f"(settled {r.settle:.0f}s after the heal), {s['model_calls']} model calls, "
              f"{s['reruns']} messages run by the model more than once"),
             "operations: " + ", ".join(f"{k} {v}" for k, v in sorted(s["ops"].items())),
             f"replies recorded unconfirmed (a crash cut the send): {s['unconfirmed']}",
             "faults injected: " + (", ".join(f"{k} {v}" for k, v in
                                              sorted(s["faults"].items())) or "none")]
    odd = Counter(f"{op.surface} {op.status}: {op.detail[:120]}" for op in r.history.ops
                  if op.status in ("info", "fail"))
    lines += [f"  {n} x {d}" for d, n in odd.most_common(examples + 2)]
    for f in r.history.faults:
        if f.note:
            lines.append(f"  fault {f.kind} {f.target}: {f.note}")
    total = sum(len(v) for v in r.anomalies.values())
    lines.append(f"anomalies: {total}" + (" (replay: --seed " + str(r.seed) + ")"
                                          if total else ""))
    for kind, items in sorted(r.anomalies.items()):
        lines.append(f"  {kind}: {len(items)}")
        lines += [f"    {x}" for x in items[:examples]]
    return "\n".join(lines)
