"""The exec reaper: kills every ``exec`` process group when the gateway dies, however it
dies (``kill -9`` included).

One small process per gateway (``python -m runtime.tools.exec_reaper``, its own session
so a group kill never reaches it), started at the first ``exec``. Its stdin is a pipe
from the gateway: one line ``+<pgid>`` when a command starts (every command leads its own
process group; ``-<pgid>`` forgets one). Linux closes
the pipe when the gateway process ends, for any reason, and EOF is the reaper's cue:
every group still listed gets SIGKILL (the command, its pipes and its ``&`` children).
Groups whose processes are all gone are dropped every :data:`PRUNE_EVERY` seconds, so
a recycled pid is never hit. A command that starts its own session (``setsid``, a daemon)
leaves its group on purpose and is not followed.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading

PRUNE_EVERY = 5.0  # seconds


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main() -> None:
    groups: set[int] = set()
    fd, buf = sys.stdin.fileno(), b""
    while True:
        ready, _, _ = select.select([fd], [], [], PRUNE_EVERY)
        if not ready:
            groups = {g for g in groups if _alive(g)}
            continue
        data = os.read(fd, 4096)
        if not data:
            break  # the gateway is gone
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            op, pgid = line[:1], line[1:]
            if pgid.isdigit():
                (groups.add if op == b"+" else groups.discard)(int(pgid))
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


class Reaper:
    """The gateway's end: ``track(pgid)``; the reaper process starts on the first call
    (and again if it died). Never raises: should the reaper not start, the command still
    runs, and the next ``track`` tries again."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "runtime.tools.exec_reaper"],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True,
                    cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                        os.path.abspath(__file__)))))
            assert self._proc.stdin is not None
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()

    def track(self, pgid: int) -> None:
        try:
            self._send(f"+{pgid}")
        except OSError:
            pass


REAPER = Reaper()

if __name__ == "__main__":
    main()
