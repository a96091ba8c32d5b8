"""Shared pieces of the scheduler tests (issue 4): an in-process gateway on a FakeClock
with a fake model, a recording channel, and small waiting/reading helpers."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from channels.base import DeliveryResult, OutboundMessage
from gateway.service.daemon import Gateway
from runtime.clock import FakeClock, parse_iso
from tests.helpers import base_config, running_gateway, stored_sessions

T0 = parse_iso("2026-01-01T00:00:00Z")  # FakeClock's default start
MAIN = "agent:main:main"


class RecordingChannel:
    """A minimal channel (channels/base.py ``Channel``) that records every send."""

    def __init__(self, name: str = "testchan", account_id: str = "default") -> None:
        self.name, self.account_id, self.state = name, account_id, "connected"
        self.sent: list[OutboundMessage] = []

    async def start(self, on_message: Any, on_event: Any) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        self.sent.append(message)
        return DeliveryResult(ok=True, message_ids=[str(len(self.sent))])

    async def typing(self, to: str, thread_id: str | None = None) -> None:
        return None

    def status(self) -> dict[str, Any]:
        return {"state": self.state}

    def texts(self, kind: str | None = None) -> list[str]:
        return [m.text for m in self.sent if kind is None or m.kind == kind]


async def until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    """Poll ``cond`` (real time: turns talk HTTP to the fake model) until truthy."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = cond()
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what or cond}")
        await asyncio.sleep(0.005)


def config(tmp_path: Path, model_url: str, *, heartbeat: dict | None = None,
           tz: str = "UTC", **sections: Any) -> dict:
    cfg = base_config(tmp_path / "state", model_url, **sections)
    cfg["agents"]["defaults"]["user_timezone"] = tz
    if heartbeat is not None:
        cfg["agents"]["defaults"]["heartbeat"] = heartbeat
    return cfg


@contextlib.asynccontextmanager
async def gateway(cfg: dict, clock: FakeClock) -> AsyncIterator[Gateway]:
    """A running gateway on ``clock`` with a :class:`RecordingChannel` registered as
    ``gw.testchan`` (delivery targets ``testchan:<to>``)."""
    async with running_gateway(cfg, clock=clock) as gw:
        ch = RecordingChannel()
        gw.deliverer.register(ch)
        gw.testchan = ch
        yield gw


async def beat(gw: Gateway, clock: FakeClock, agent: str = "main",
               reason: str = "test") -> Any:
    """Request a beat, let the coalescing window pass, wait for its outcome."""
    runner = gw.scheduling.heartbeat
    n = len(runner.outcomes)
    assert runner.request_heartbeat_now(agent, reason)
    await clock.advance(0.25)
    await until(lambda: len(runner.outcomes) > n, what="a heartbeat outcome")
    return runner.outcomes[-1]


def sessions_json(gw: Gateway, agent: str = "main") -> dict:
    """The agent's session store as committed on disk (``{session_key: entry}``)."""
    return stored_sessions(gw.state_dir, agent)


def transcript_path(gw: Gateway, key: str = MAIN, agent: str = "main") -> Path:
    entry = gw.agents[agent].store.get(key)
    assert entry is not None, f"no session {key}"
    return gw.state_dir / "agents" / agent / "sessions" / f"{entry.session_id}.jsonl"


def transcript(gw: Gateway, key: str = MAIN, agent: str = "main") -> list[dict]:
    return [json.loads(line) for line in transcript_path(gw, key, agent).read_text()
            .splitlines()]


def system_prompt(request: Any) -> str:
    """The system message a recorded fake-model request carried."""
    msgs = request.json["messages"]
    assert msgs[0]["role"] == "system"
    return msgs[0]["content"]


def events_section(request: Any) -> list[str]:
    """The event lines of the "Runtime System Events" section of a request ([] if none)."""
    text = system_prompt(request)
    head = "## Runtime System Events (gateway-generated)"
    if head not in text:
        return []
    body = text.split(head, 1)[1]
    return [ln for ln in body.splitlines() if ln.startswith("- [")]
