"""Shared pieces of the end-to-end channel tests (tests/test_gateway_{telegram,slack,
discord}.py, tests/test_gateway_channels_restart.py): the real gateway in-process, a fake
platform and a fake model, plus small readers for what ended up on disk.

Everything here observes; nothing replaces gateway code. Waiting is real time in short
steps (the platform fakes and the model fake answer in milliseconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gateway.cli import main as cli_main
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import stored_sessions

BOT_REPLY = "Hi there, **friend**!"


async def until(pred: Callable[[], Any], timeout: float = 8.0, what: str = "condition"
                ) -> Any:
    """Poll ``pred()`` every 10 ms until it is truthy; returns its value. AssertionError
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


def chat_requests(model: FakeOpenAI) -> list[dict[str, Any]]:
    """Bodies of the chat-completion requests the fake model received (one per model
    call; a turn without tools is exactly one)."""
    return [r.json for r in model.requests if r.path.endswith("/chat/completions")]


def last_user_text(body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def sessions_on_disk(state_dir: Path, agent: str = "main") -> dict[str, dict[str, Any]]:
    """The session store of ``agent`` on disk as ``{session_key: entry}`` ({} when
    missing)."""
    return stored_sessions(state_dir, agent)


async def sessions_with(state_dir: Path, *keys: str, agent: str = "main",
                        timeout: float = 8.0) -> dict[str, dict[str, Any]]:
    """The stored sessions once they hold every key in ``keys`` (the store writes it shortly
    after a change, not before the reply goes out)."""
    def complete() -> dict[str, dict[str, Any]] | None:
        on_disk = sessions_on_disk(state_dir, agent)
        return on_disk if set(keys) <= set(on_disk) else None
    return await until(complete, timeout, f"sessions {keys} on disk")


async def new_session_on_disk(state_dir: Path, key: str, old_session_id: str,
                              agent: str = "main") -> str:
    """Wait until ``key`` has a session id other than ``old_session_id`` on disk."""
    def current() -> str | None:
        sid = sessions_on_disk(state_dir, agent).get(key, {}).get("session_id")
        return sid if sid and sid != old_session_id else None
    return await until(current, what=f"a new session for {key} on disk")


def outbox_files(state_dir: Path) -> list[dict[str, Any]]:
    """The pending outbox entries on disk (``<state_dir>/outbox/*.json``)."""
    return [json.loads(p.read_text()) for p in sorted((state_dir / "outbox").glob("*.json"))]


def fences_balanced(markdown: str) -> bool:
    """True when every ``` fence opened in ``markdown`` is closed again."""
    return sum(1 for line in markdown.splitlines() if line.lstrip().startswith("```")) % 2 == 0


def long_reply(code_lines: int = 110) -> str:
    """A ~9,000-character model reply: prose, a code block longer than Discord's and
    Telegram's whole message limit, more prose, a second code block. Line ``i`` of the
    first block is ``value_{i:03d} = ...`` so the parts can be checked for loss/duplicates."""
    intro = "Here is the full script you asked for, with a few notes.\n\n"
    block1 = "```python\n" + "\n".join(
        f"value_{i:03d} = compute({i}, scale=2) + offset  # step {i:03d} <ok> & done"
        for i in range(code_lines)) + "\n```\n\n"
    prose = "\n\n".join(
        f"Paragraph {n}: the tide rises and falls twice a day, and the gateway keeps "
        f"every reply in order even when the platform splits it into several messages."
        for n in range(12)) + "\n\n"
    block2 = "```bash\n" + "\n".join(f"echo line-{i:02d}" for i in range(30)) + "\n```\n"
    text = intro + block1 + prose + block2 + "\nThat's all."
    assert len(text) >= 9000, len(text)
    return text


CODE_LINE = re.compile(r"value_(\d{3}) = compute")


def code_line_numbers(parts: list[str]) -> list[int]:
    """The ``value_NNN`` line numbers found across ``parts``, in order."""
    return [int(m.group(1)) for p in parts for m in CODE_LINE.finditer(p)]


class EventHook:
    """Stands in for the system-event queue: records what the gateway hands to
    ``Intake.on_channel_event(session_key, text, source, sender=...)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, session_key: str, text: str, source: str, **_kw) -> None:
        self.calls.append((session_key, text, source))


def write_config(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class _ThreadStream(io.TextIOBase):
    """sys.stdout/stderr stand-in: writes from one thread go to ``buffer``, the rest (the
    gateway's console log lines, written meanwhile by the event loop) to ``original``.
    Class-level fallbacks: a write that reaches a half-made instance (a print from another
    thread while it is being set up) goes to the real stdout instead of raising inside
    the gateway's logging, which would fail the turn it logs for. Writes and flushes of
    ``original`` from other threads share one lock, and the owner never flushes it:
    Python 3.11's TextIOWrapper is not safe against a write racing a flush from another
    thread (a worker segfaulted in print)."""

    original: Any = sys.__stdout__
    buffer: Any = None
    owner: int | None = None
    _lock = threading.Lock()

    def __init__(self, original: Any, buffer: io.StringIO) -> None:
        self.original, self.buffer = original, buffer
        self.owner = threading.get_ident()

    def write(self, s: str) -> int:
        if threading.get_ident() == self.owner:
            return self.buffer.write(s)
        with self._lock:
            return self.original.write(s)

    def flush(self) -> None:
        if threading.get_ident() != self.owner:
            with self._lock:
                self.original.flush()


async def run_cli(config_path: Path, *args: str) -> tuple[int, str, str]:
    """Run ``tidegate --config <path> <args>`` in a worker thread (the CLI blocks on the
    control API, which this event loop serves). Returns (exit code, stdout, stderr) of the
    CLI alone."""
    def run() -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(_ThreadStream(sys.stdout, out)), \
                contextlib.redirect_stderr(_ThreadStream(sys.stderr, err)):
            try:
                code = cli_main(["--config", str(config_path), *args])
            except SystemExit as exc:  # argparse errors
                code = int(exc.code or 0)
        return code, out.getvalue(), err.getvalue()
    return await asyncio.to_thread(run)


def log_events(logs: list[dict[str, Any]], event: str, **match: Any) -> list[dict[str, Any]]:
    """Captured log records (structlog.testing.capture_logs) named ``event`` whose fields
    equal ``match``."""
    return [r for r in logs if r.get("event") == event
            and all(r.get(k) == v for k, v in match.items())]


async def started_slack(slack: Any, clock: Any, on_message: Callable[[Any], Any] | None = None
                        ) -> Any:
    """A started SlackChannel (Socket Mode) on the fake ``slack`` and ``clock``; inbound
    messages go to ``on_message`` (async), events are dropped. The caller stops it."""
    from channels.slack.adapter import SlackChannel
    from channels.slack.config import SlackAccount

    async def ignore(_: Any) -> None:
        pass
    ch = SlackChannel("default", SlackAccount(bot_token=slack.bot_token,
                                              app_token=slack.app_token,
                                              api_base_url=slack.api_url), clock=clock)
    await ch.start(on_message or ignore, ignore)
    return ch
