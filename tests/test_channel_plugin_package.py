"""A third-party channel plugin, end to end: the minichat package of
docs/channels/plugins.md is written out from that page, installed with pip into a virtual
environment (on top of the test environment's packages), and a real ``tidegate gateway``
process from that environment holds a conversation through it with the fake model:
a redelivered message answered once, a send that fails once retried from the outbox.
It also shows in ``plugins list``/``status``."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import site
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.channel_harness import chat_requests, until
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import ROOT, GatewayProcess, base_config

pytestmark = pytest.mark.timeout(90)
TOKEN = "mc-bot-token-0123456789"
FILE = re.compile(r"^File `([^`]+)`\n\n```\w*\n(.*?)\n```$", re.MULTILINE | re.DOTALL)


def example_files() -> dict[str, str]:
    """The package as the docs page shows it: ``{relative path: text}``."""
    page = (ROOT / "docs" / "channels" / "plugins.md").read_text(encoding="utf-8")
    return {m.group(1): m.group(2) + "\n" for m in FILE.finditer(page)}


class FakeMinichat:
    """The made-up platform of the example: ``GET /api/updates?after=&timeout=`` (long
    poll) and ``POST /api/send``; ``fail_sends`` answers that many sends 503."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.attempts: list[dict[str, Any]] = []
        self.fail_sends = 0
        self.polls = 0
        self._seq = itertools.count(1)
        self._ids = itertools.count(100)
        self._new = asyncio.Event()
        app = web.Application()
        app.router.add_get("/api/updates", self._updates)
        app.router.add_post("/api/send", self._send)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def say(self, text: str, *, msg_id: str, user: str = "u-alice") -> dict[str, Any]:
        update = {"seq": next(self._seq), "id": msg_id, "chat": user, "chat_type": "dm",
                  "user": user, "user_name": "Alice", "text": text}
        self.updates.append(update)
        self._new.set()
        return update

    def redeliver(self, update: dict[str, Any]) -> None:
        """The same message again at a new position (its acknowledgement was lost)."""
        self.updates.append({**update, "seq": next(self._seq)})
        self._new.set()

    def accepted(self) -> list[str]:
        return [a["text"] for a in self.attempts if a["status"] == 200]

    async def _updates(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": "unauthorized"}, status=401)
        self.polls += 1
        after = int(request.query.get("after", "0"))
        timeout = float(request.query.get("timeout", "1"))
        ready = [u for u in self.updates if u["seq"] > after]
        if not ready:
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), min(timeout, 1.0))
            except TimeoutError:
                pass
            ready = [u for u in self.updates if u["seq"] > after]
        return web.json_response({"updates": ready})

    async def _send(self, request: web.Request) -> web.Response:
        body = await request.json()
        status = 503 if self.fail_sends > 0 else 200
        self.fail_sends -= status == 503
        self.attempts.append({**body, "status": status})
        if status != 200:
            return web.json_response({"error": "unavailable"}, status=status)
        return web.json_response({"id": next(self._ids)})


def make_venv(tmp: Path) -> str:
    """A venv without pip whose site-packages also loads this test environment's (its
    ``.pth`` files included); returns its python."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [own] = list((venv / "lib").glob("python3*/site-packages"))
    (own / "tidegate-test-env.pth").write_text("".join(
        f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages()))
    return str(venv / "bin" / "python")


def build_and_install(python: str, package: Path, dist: Path) -> None:
    """Build the wheel (setuptools' PEP 517 backend, as pip would) and install it with
    the venv's pip (this environment's, through the ``.pth``)."""
    subprocess.run([python, "-c", ("import sys; from setuptools import build_meta; "
                    "build_meta.build_wheel(sys.argv[1])"), str(dist)], cwd=package,
                   check=True, capture_output=True, timeout=120)
    [wheel] = dist.glob("tidegate_minichat-*.whl")
    r = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--disable-pip-version-check", str(wheel)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def api_status(gw: GatewayProcess) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{gw.port}/status",
                                     headers={"Authorization": f"Bearer {gw.token}"})
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


async def test_an_installed_channel_plugin_holds_a_conversation(tmp_path):
    package = tmp_path / "tidegate-minichat"
    for rel, text in example_files().items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    assert {"pyproject.toml", "minichat_channel/plugin.py",
            "minichat_channel/adapter.py"} <= set(example_files())
    python = await asyncio.to_thread(make_venv, tmp_path)
    await asyncio.to_thread(build_and_install, python, package, tmp_path / "dist")

    chat = FakeMinichat()
    await chat.server.start_server()
    async with FakeOpenAI() as model:
        cfg = base_config(tmp_path / "state", model.base_url, channels={"minichat": {
            "enabled": True, "url": chat.url, "token": TOKEN, "dm_policy": "open",
            "poll_timeout": 1}})
        gw = GatewayProcess(tmp_path, cfg, python=python)
        try:
            await asyncio.to_thread(gw.start)
            first = chat.say("hello plugin", msg_id="m-1")
            await until(lambda: chat.accepted(), timeout=15, what="the first reply")
            chat.redeliver(first)  # answered once: the gateway's dedupe
            chat.say("sentinel", msg_id="m-2")
            await until(lambda: len(chat.accepted()) == 2, timeout=15, what="sentinel")
            chat.fail_sends = 1  # the next send fails once: kept in the outbox, resent
            chat.say("retry me", msg_id="m-3")
            await until(lambda: len(chat.accepted()) == 3, timeout=20, what="the retry")
            listed = json.loads((await asyncio.to_thread(
                gw.cli, "plugins", "list", "--json")).stdout)
            status = await asyncio.to_thread(api_status, gw)
        finally:
            code = await asyncio.to_thread(gw.stop)
            await chat.server.close()
    assert code == 0
    assert chat.accepted() == ["echo: hello plugin", "echo: sentinel", "echo: retry me"]
    assert [a["status"] for a in chat.attempts if a["text"] == "echo: retry me"] == [503, 200]
    assert len(chat_requests(model)) == 3  # the redelivered message never reached it
    [row] = [r for r in listed if r["name"] == "minichat"]
    assert (row["kind"], row["version"], row["source"], row["package"], row["state"]) == (
        "channel", "0.3.0", "package", "tidegate-minichat", "loaded")
    assert {r["name"] for r in listed if r["source"] == "builtin"} >= {
        "telegram", "slack", "discord"}
    assert status["channels"]["minichat"]["state"] == "connected"
    events = [e.get("event") for e in gw.log_lines()]
    assert "inbound_duplicate" in events and "delivery_queued_in_outbox" in events
    assert "outbox_sent" in events
