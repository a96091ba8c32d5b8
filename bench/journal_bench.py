"""Intake journal benchmark (issue 8 "write-ahead intake journal"; README "Delivery
guarantees").

Run: ``.venv/bin/python bench/journal_bench.py [--messages 100000] [--concurrency 50]``

Prints, against stated targets, PASS/FAIL:

- CPU per message for the whole journal life of a message (accept + start + done, with
  compaction, no fsync) [<= 50 µs], and its flatness: the last tenth of the messages
  costs at most 1.5x the first tenth [flat], with the file size at the end
  [<= 4 MB: bounded by compaction, not by the messages seen];
- the latency of ``accept`` + ``durable()`` (fsync) for ``--concurrency`` messages
  arriving together, p50/p99 [p99 <= 50 ms on a local disk], and how many fsyncs they
  shared (group commit);

in a temp dir on the state dir's usual file system (``$TMPDIR``). A script that prints
figures, not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from gateway.journal.store import IntakeJournal
from runtime.clock import SYSTEM_CLOCK


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def lifecycle(path: Path, n: int) -> None:
    j = IntakeJournal(path, SYSTEM_CLOCK, fsync=False)
    j.load()
    tenth = max(1, n // 10)
    costs = []
    for block in range(10):
        t0 = time.process_time()
        for i in range(tenth):
            e = j.accept("agent:main:telegram:dm:42", {"text": f"message {block}-{i}",
                                                       "channel": "telegram"})
            j.started([e.id], f"run{block}-{i}")
            j.done(e.id)
        costs.append((time.process_time() - t0) / tenth * 1e6)
    size = path.stat().st_size
    j.close()
    per = statistics.mean(costs)
    ratio = costs[-1] / costs[0]
    print(f"journal CPU per message: {per:.1f} µs (first tenth {costs[0]:.1f}, last "
          f"{costs[-1]:.1f}) [<= 50 µs] {verdict(per <= 50)}")
    print(f"  flat over {n} messages: last/first = {ratio:.2f} [<= 1.5] "
          f"{verdict(ratio <= 1.5)}; compactions {j.compactions}")
    print(f"  file size at the end: {size / 1e6:.2f} MB [<= 4 MB] {verdict(size <= 4e6)}")


async def group_commit(path: Path, concurrency: int, rounds: int = 20) -> None:
    j = IntakeJournal(path, SYSTEM_CLOCK, fsync=True)
    j.load()
    fsyncs = 0
    real = os.fsync

    def counting(fd: int) -> None:
        nonlocal fsyncs
        fsyncs += 1
        real(fd)

    os.fsync = counting  # type: ignore[assignment]
    lat: list[float] = []

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        j.accept("agent:main:slack:dm:u1", {"text": f"burst {i}"})
        await j.durable()
        lat.append((time.perf_counter() - t0) * 1000)

    try:
        for r in range(rounds):
            await asyncio.gather(*(one(r * concurrency + i) for i in range(concurrency)))
    finally:
        os.fsync = real  # type: ignore[assignment]
        j.close()
    lat.sort()
    p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]
    print(f"accept+fsync, {concurrency} at once x {rounds}: p50 {p50:.2f} ms, p99 "
          f"{p99:.2f} ms [p99 <= 50 ms] {verdict(p99 <= 50)}; {fsyncs} fsyncs for "
          f"{len(lat)} messages")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--concurrency", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lifecycle(Path(tmp) / "a.jsonl", args.messages)
        asyncio.run(group_commit(Path(tmp) / "b.jsonl", args.concurrency))


if __name__ == "__main__":
    main()
