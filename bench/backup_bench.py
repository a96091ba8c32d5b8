"""Backups benchmark: an in-process gateway (built-in echo model) serving ``--sessions``
sessions x ``--turns`` turns, then ``backup create`` while ``--during`` more turns keep
flowing (made by the gateway, as ``backup create`` with it running: one cut, whose
writer hold is printed), ``backup verify`` and ``backup restore``; the restored timeline
is verified.

    .venv/bin/python bench/backup_bench.py [--sessions 20] [--turns 50] [--during 200]

Prints the state size, the archive size and the wall time of each step, and the turns
served while the backup ran. Target: a backup never stops the gateway from serving (turns
complete during it) and verify + restore of a 1,000-turn state dir take under 5 s on this
kind of machine. The machine is shared: compare the load average printed. A benchmark,
not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.backup.check import restore, verify_archive
from tests.helpers import base_config, running_gateway


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


async def main(sessions: int, turns: int, during: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tidegate-backup-bench-") as tmp:
        tmp_path = Path(tmp)
        async with running_gateway(base_config(tmp_path / "state")) as gw:
            for t in range(turns):
                await asyncio.gather(*(gw.local.send(f"turn {t} " + "x" * 200, to=f"u{s}")
                                       for s in range(sessions)))
            await gw.timeline_hooks.flush()
            served = 0

            async def flow() -> None:
                nonlocal served
                for t in range(during):
                    await gw.local.send(f"during {t}", to=f"u{t % sessions}")
                    served += 1
            flowing = asyncio.create_task(flow())
            t0 = time.perf_counter()
            made = await gw.backup.create(dest=tmp_path / "b.tar.gz")
            create_s = time.perf_counter() - t0
            during_backup = served
            await flowing
        t0 = time.perf_counter()
        checked = verify_archive(made.path)
        verify_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        restored = restore(made.path, tmp_path / "restored")
        restore_s = time.perf_counter() - t0
        print(f"load average {os.getloadavg()[0]:.2f}; {sessions} sessions x {turns} turns")
        print(f"state dir {size(tmp_path / 'state') / 1e6:.1f} MB -> archive "
              f"{made.bytes / 1e6:.2f} MB, {made.files} files")
        print(f"create {create_s:.2f} s ({during_backup} turns served meanwhile, writers "
              f"held {made.cut['hold_ms']:.2f} ms); verify "
              f"{verify_s:.2f} s ok={checked.ok}; restore {restore_s:.2f} s "
              f"ok={restored.ok}; timeline {checked.sessions} sessions, {checked.events} "
              "events")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--during", type=int, default=200)
    a = ap.parse_args()
    asyncio.run(main(a.sessions, a.turns, a.during))
