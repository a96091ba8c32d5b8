"""The system under test: N ``tidegate gateway`` replicas (real processes) on one real
PostgreSQL, one fake Telegram bot account, the recording fake model, an isolated cron job.

Sessions are Telegram DMs (``dm_scope: per-peer``): session ``s<i>`` is chat ``CHAT0 + i``
and key ``agent:main:dm:<chat>``; every surface addresses that key (the OpenAI endpoint by
its ``X-Session-Key`` header, ``tidegate agent -m`` by ``--session-key``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.cluster_check.model import RecordingModel
from tests.cluster_harness import database_of, start_private_server, wait
from tests.fakes import fake_telegram
from tests.helpers import GatewayProcess, base_config

CHAT0 = 9100


def key_of(session: int) -> str:
    """The session key of session ``s<session>``."""
    return f"agent:main:dm:{CHAT0 + session}"


class Cluster:
    """Start with :meth:`start`, end with :meth:`close`. ``replicas`` maps ``r<i>`` to its
    :class:`GatewayProcess`; ``up`` says which are running (not killed, not paused).
    ``pg``: a running server to use (a fresh database on it; left running at the end),
    else a private one is started (and destroyed); the ``pg`` fault needs a private one."""

    def __init__(self, tmp: Path, n: int, *, ttl: float = 3.0, latency: float = 0.05,
                 cron_every: float = 0.0, pg=None) -> None:
        self.tmp, self.n, self.ttl, self.latency = tmp, n, ttl, latency
        self.cron_every = cron_every
        self.replicas: dict[str, GatewayProcess] = {}
        self.paused: set[str] = set()
        self.shared_pg = pg is not None
        self.pg = pg
        self.dsn = ""
        self.model = None
        self.bot = None
        self.cron_job: str | None = None

    def start(self) -> Cluster:
        if self.pg is None:
            self.pg = start_private_server()
        self.dsn = self.pg.create_database()
        self.model = RecordingModel.start_in_thread(latency=self.latency)
        self.bot = fake_telegram.start_in_thread(token="300:CHECKER-bot", bot_id=7_300_000_001,
                                                 bot_username="checker_bot")
        for i in range(self.n):
            name = f"r{i + 1}"
            d = self.tmp / name
            d.mkdir(parents=True, exist_ok=True)
            self.replicas[name] = GatewayProcess(d, self._config(name))
        with ThreadPoolExecutor(self.n) as pool:
            list(pool.map(lambda p: p.start(timeout=90), self.replicas.values()))
        wait(lambda: self.sql("SELECT count(*) FROM cluster_leases WHERE name LIKE "
                              "'account:%'").strip() == "1", timeout=60, what="bot owner")
        if self.cron_every:
            self.cron_job = self._add_cron()
        return self

    def _config(self, name: str) -> dict:
        account = {"token": self.bot.fake.token, "api_base_url": f"{self.bot.url}/bot",
                   "poll_timeout": 1, "dm_policy": "open"}
        cfg = base_config(self.tmp / name / "state", self.model.base_url,
                          channels={"telegram": {"enabled": True, **account}},
                          storage={"backend": "postgres", "dsn": self.dsn},
                          cluster={"lease_ttl": f"{self.ttl}s", "replica_id": name},
                          session={"dm_scope": "per-peer"}, logging={"level": "info"})
        cfg["gateway"]["journal_fsync"] = False
        return cfg

    def _add_cron(self) -> str:
        out = self.any_live().cli("cron", "add", "--name", "checker", "--every",
                                  f"{self.cron_every:g}s", "--message", "cron-tick j1",
                                  "--session", "isolated", "--json", timeout=60).stdout
        return json.loads(out)["id"]

    # -- queries ---------------------------------------------------------------------

    def sql(self, query: str) -> str:
        """``query``'s unaligned psql output on the cluster's database."""
        return self.pg.psql(query, database_of(self.dsn))

    def rows(self, query: str) -> list[list[str]]:
        """``query``'s rows, columns split on ``|``."""
        return [line.split("|") for line in self.sql(query).splitlines() if line]

    def running(self, name: str) -> bool:
        p = self.replicas[name]
        return p.proc is not None and p.proc.poll() is None

    def live(self) -> list[str]:
        """Replicas running and not paused, in name order."""
        return [n for n in sorted(self.replicas) if self.running(n) and n not in self.paused]

    def busiest(self) -> str:
        """The live replica holding the most lane leases (the account owner first)."""
        held = dict.fromkeys(self.live(), 0)
        for name, rid in self.rows("SELECT name, replica_id FROM cluster_leases"):
            if rid in held:
                held[rid] += 1 + 1000 * name.startswith("account:")
        return max(held, key=held.get)

    def any_live(self) -> GatewayProcess:
        return self.replicas[self.live()[0]]

    # -- faults ----------------------------------------------------------------------

    def kill9(self, name: str) -> None:
        self.replicas[name].kill9()

    def pause(self, name: str) -> None:
        os.kill(self.replicas[name].proc.pid, signal.SIGSTOP)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.replicas[name].proc.pid, signal.SIGCONT)
        self.paused.discard(name)

    def restart(self, name: str, timeout: float = 90) -> None:
        """SIGTERM (when running) and start again; raises when it does not come up."""
        p = self.replicas[name]
        if self.running(name):
            p.stop(timeout=60)
        p.start(timeout=timeout)

    def set_latency(self, seconds: float) -> None:
        self.model.server.latency = seconds

    def heal(self, revive: bool = True) -> list[str]:
        """Undo every fault: PostgreSQL up, replicas resumed and (``revive``) started,
        model latency back. Returns the replicas that could not be started (with the
        reason)."""
        self.set_latency(self.latency)
        if not self.shared_pg and not self.pg.running():
            self.pg.start()
        for n in list(self.paused):
            self.resume(n)
        failed = []
        for n in sorted(self.replicas) if revive else ():
            if not self.running(n):
                try:
                    self.replicas[n].start(timeout=90)
                except (RuntimeError, TimeoutError) as exc:
                    failed.append(f"{n}: {str(exc)[:300]}")
        return failed

    def close(self) -> None:
        for n in list(self.paused):
            self.resume(n)
        live = [p for n, p in self.replicas.items() if self.running(n)]
        if live:
            with ThreadPoolExecutor(len(live)) as pool:
                list(pool.map(_stop_quietly, live))
        for thing in (self.bot, self.model):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.stop()
        if self.pg is not None and not self.shared_pg:
            self.pg.destroy()


def _stop_quietly(p: GatewayProcess) -> None:
    try:
        p.stop(timeout=30)
    except (subprocess.TimeoutExpired, AssertionError):
        with contextlib.suppress(Exception):
            p.kill9()


def now() -> float:
    return time.monotonic()
