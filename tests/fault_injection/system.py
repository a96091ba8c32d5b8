"""The system under test: one ``tidegate gateway`` process on a real PostgreSQL (a private
server: the nemesis stops it), the Telegram, Slack and Discord fakes, the fault model, and
a supervisor thread that starts the gateway again whenever it died on its own (the
poison), as systemd's ``Restart=always`` would. A kill by the nemesis holds the
supervisor off until the nemesis starts the gateway itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.cluster_harness import start_private_server
from tests.fakes import fake_discord, fake_slack, fake_telegram
from tests.fault_injection.model import FaultModel
from tests.helpers import GatewayProcess, base_config

TG_USERS = (6101, 6102, 6103)
SLACK_USERS = ("U0ALICE", "U0BOB")
DISCORD_USERS = ("alice", "bob")


class System:
    """``start()``, then drive it; ``close()`` always. ``deaths`` counts the gateway's
    own exits (not the nemesis's kills); ``boots`` every start."""

    def __init__(self, tmp: Path, *, model_timeout: float = 2.0, latency: float = 0.02,
                 streaming: str = "off", storage: str = "postgres") -> None:
        self.tmp, self.model_timeout, self.latency = tmp, model_timeout, latency
        self.storage = storage  # postgres | embedded (the intake journal on disk)
        self.streaming = streaming
        self.pg: Any = None
        self.model: Any = None
        self.tg: Any = None
        self.slack: Any = None
        self.dc: Any = None
        self.gw: GatewayProcess | None = None
        self.life = threading.RLock()  # start/kill of the gateway, one at a time
        self.held = False  # the nemesis owns the gateway's restart
        self.deaths = 0
        self.boots = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> System:
        self.pg = start_private_server()  # stopped by the nemesis either way
        dsn = self.pg.create_database()
        self.model = FaultModel.start_in_thread(latency=self.latency)
        self.tg = fake_telegram.start_in_thread(token="301:FAULTS-bot")
        # Slack's retry of an event the app did not acknowledge within 3 s: an envelope
        # written to the socket of a gateway killed at that instant, or one whose ack the
        # gateway withheld (not journaled yet: PostgreSQL down), is delivered again.
        # Slack's three retries span about 6 minutes (at once, ~1 min, ~5 min); the run
        # lasts seconds, so that window is compressed into 8 retries 3 s apart, enough to
        # outlast a PostgreSQL stop plus a restart.
        self.slack = fake_slack.start_in_thread(redeliver_after=3.0, max_retries=8)
        self.dc = fake_discord.start_in_thread()
        self.gw = GatewayProcess(self.tmp, self._config(dsn))
        self.boot()
        self._threads = [threading.Thread(target=fn, name=fn.__name__, daemon=True)
                         for fn in (self._supervise,)]
        for t in self._threads:
            t.start()
        return self

    def _config(self, dsn: str) -> dict[str, Any]:
        common = {"dm_policy": "open", "streaming": self.streaming}
        cfg = base_config(self.tmp / "state", self.model.base_url, channels={
            "telegram": {"enabled": True, "token": self.tg.fake.token,
                         "api_base_url": f"{self.tg.url}/bot", "poll_timeout": 1, **common},
            "slack": {"enabled": True, "bot_token": self.slack.fake.bot_token,
                      "app_token": self.slack.fake.app_token,
                      "api_base_url": self.slack.api_url, **common},
            "discord": {"enabled": True, "token": self.dc.fake.token,
                        "api_base_url": self.dc.api_url, "gateway_url": self.dc.gateway_url,
                        **common}},
            logging={"level": "info"})
        if self.storage == "postgres":
            cfg["storage"] = {"backend": "postgres", "dsn": dsn}
            cfg["cluster"] = {"lease_ttl": "3s", "replica_id": "r1"}
        cfg["models"].update({"timeout": f"{self.model_timeout}s", "retries": 1,
                              "retry_backoff": "0.1s", "max_retry_wait": "2s",
                              "cooldowns": {"rate_limit": "1s", "transient": "0s"}})
        cfg["agents"]["defaults"]["timeout"] = "30s"
        cfg["gateway"]["journal_fsync"] = False
        cfg["cron"] = {"enabled": False}
        # the poison's sender is the operator (an owner): its message does not taint the
        # turn, so exec runs without an approval (tools.taint, docs/exec.md)
        cfg["tools"] = {"taint": {"owners": ["telegram:6109"]}}
        return cfg

    # -- the gateway's life --------------------------------------------------------------

    def boot(self, timeout: float = 90.0) -> None:
        """Start the gateway and wait until it is ready (raises when it is not)."""
        assert self.gw is not None
        with self.life:
            self.gw.start(timeout=timeout)
            self.boots += 1

    def running(self) -> bool:
        p = self.gw.proc if self.gw is not None else None
        return p is not None and p.poll() is None

    def kill9(self) -> None:
        """SIGKILL the gateway and hold the supervisor off (``boot()`` + ``release()``)."""
        with self.life:
            self.held = True
            if self.running():
                self.gw.kill9()

    def release(self) -> None:
        self.held = False

    def _supervise(self) -> None:
        while not self._stop.wait(0.1):
            with self.life:
                if self.held or self.running() or self.gw.proc is None:
                    continue
                self.gw.kill9()  # reaps it and closes its log files (already dead)
                self.deaths += 1
                with contextlib.suppress(RuntimeError, TimeoutError):
                    self.boot()

    # -- what a user or operator sees ----------------------------------------------------

    def port_token(self) -> tuple[int, str] | None:
        """The running gateway's HTTP port and token (None while it is down)."""
        try:
            return self.gw.port, self.gw.token
        except (OSError, ValueError, KeyError):
            return None

    def cli_json(self, *args: str) -> Any:
        out = self.gw.cli(*args, "--json", timeout=60).stdout
        return json.loads(out)

    def http(self, path: str) -> bytes:
        """GET ``path`` on the running gateway with its token (raises OSError when down)."""
        port, token = self.port_token() or (0, "")
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read()

    def metrics(self) -> str:
        return self.http("/metrics").decode()

    def on_loop(self, handle: Any, coro: Any) -> Any:
        """Run a fake's coroutine on that fake's loop (Slack, Discord)."""
        loop = getattr(handle, "_loop", None) or handle.loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result(15)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        with self.life:
            if self.running():
                try:
                    self.gw.stop(timeout=30)
                except Exception:  # noqa: BLE001 - tear down whatever happens
                    with contextlib.suppress(Exception):
                        self.gw.kill9()
        for thing in (self.tg, self.slack, self.dc, self.model):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.stop()
        if self.pg is not None:
            self.pg.destroy()

    def wait(self, pred: Any, timeout: float, every: float = 0.2) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(every)
        return False
