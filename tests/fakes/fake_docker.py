"""A stand-in ``docker`` client for machines without a Docker daemon: a script put first
on ``PATH`` that keeps its "containers" in a JSON file, and a Unix socket for
``$DOCKER_HOST`` that accepts connections (the gateway's reachability check).

- ``docker run ... --name N --label K=V ... IMAGE /bin/sh -c CMD`` records container
  ``N`` (its labels, the pid of a process in a session of its own that sleeps: the
  container "runs" while it lives, whatever becomes of the client) and waits for it;
- ``docker ps -aq --filter label=K=V`` prints the names of the recorded containers with
  that label;
- ``docker rm -f N...`` forgets them and kills their processes.

Every call's argv is appended to ``calls.log`` (one JSON list a line). Use
:meth:`FakeDocker.env` for ``PATH`` and ``DOCKER_HOST``; :meth:`close` kills what is
left and removes the files.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

_SCRIPT = r'''#!{python}
import fcntl, json, os, sys, time
HERE = {here!r}
args = sys.argv[1:]
with open(os.path.join(HERE, "calls.log"), "a") as f:
    f.write(json.dumps(args) + "\n")


def update(change):
    with open(os.path.join(HERE, "containers.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = os.path.join(HERE, "containers.json")
        state = json.load(open(path)) if os.path.exists(path) else {{}}
        out = change(state)
        with open(path + ".tmp", "w") as f:  # readers never see half a file
            json.dump(state, f)
        os.replace(path + ".tmp", path)
        return out


if args[:1] == ["run"]:
    name = args[args.index("--name") + 1]
    labels = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--label")
    # the "container" is a process of its own session, as a real one belongs to the
    # daemon: killing the client (or the gateway with it) leaves it running
    child = os.fork()
    if child == 0:
        os.setsid()
        for fd in (0, 1, 2):
            os.dup2(os.open(os.devnull, os.O_RDWR), fd)
        time.sleep(60)
        os._exit(0)
    update(lambda s: s.__setitem__(name, {{"labels": labels, "pid": child}}))
    os.waitpid(child, 0)
elif args[:2] == ["ps", "-aq"]:
    key, _, value = args[args.index("--filter") + 1].removeprefix("label=").partition("=")
    for name in update(lambda s: [n for n, c in s.items() if c["labels"].get(key) == value]):
        print(name)
elif args[:2] == ["rm", "-f"]:
    def forget(s):
        return [s.pop(n)["pid"] for n in args[2:] if n in s]
    for pid in update(forget):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
'''


class FakeDocker:
    """The fake client and daemon socket in a short temp dir (Unix socket paths are
    short). ``containers()`` -> ``{name: {"labels": {...}, "pid": int}}``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tg-fdock-"))
        script = self.dir / "docker"
        script.write_text(_SCRIPT.format(python=sys.executable, here=str(self.dir)))
        script.chmod(0o755)
        self.socket_path = self.dir / "docker.sock"
        self._daemon = socket.socket(socket.AF_UNIX)
        self._daemon.bind(str(self.socket_path))
        self._daemon.listen(16)

    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.dir}:{os.environ['PATH']}",
                "DOCKER_HOST": f"unix://{self.socket_path}"}

    def containers(self) -> dict[str, Any]:
        path = self.dir / "containers.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def add(self, name: str, labels: dict[str, str]) -> None:
        """A container some earlier process left (no process behind it)."""
        state = self.containers()
        state[name] = {"labels": labels, "pid": 0x7FFFFFFF}
        (self.dir / "containers.json.tmp").write_text(json.dumps(state))
        (self.dir / "containers.json.tmp").replace(self.dir / "containers.json")

    def calls(self) -> list[list[str]]:
        path = self.dir / "calls.log"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def close(self) -> None:
        for c in self.containers().values():
            try:
                os.kill(c["pid"], signal.SIGKILL)
            except (ProcessLookupError, OverflowError):
                pass
        self._daemon.close()
        shutil.rmtree(self.dir, ignore_errors=True)
