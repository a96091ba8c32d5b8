"""The fake model of the fault-injection run: the fake OpenAI server with a switchable
failure ``mode`` and a poison payload.

Every message of the plan carries a tag ``fi-m<id>``; the answer echoes the last user
message (``echo: <text>``), so a reply names the one message it answers. ``mode`` (set
from the nemesis thread): ``ok``; ``500`` (a server error), ``429`` (rate limited, with
``Retry-After: 1``), ``hang`` (no answer: the gateway's model timeout cuts the call).

The poison payload (a message holding :data:`POISON`) is answered, every time, with an
``exec`` call of ``kill -9 $PPID``: the command's shell is a child of the gateway, so the
tool takes the gateway process down (the way a crashing native library, an out-of-memory
kill in a tool or a runaway command would). Its turn dies the same way on every replay.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from tests.fakes.fake_openai import FakeOpenAI

TAG = re.compile(r"\bfi-m(\d+)\b")
POISON = "POISON-PAYLOAD"
MODES = ("ok", "500", "429", "hang")


def tags(text: str) -> list[int]:
    """The plan's message ids named in ``text``."""
    return [int(x) for x in TAG.findall(text or "")]


@dataclass
class Call:
    """One model call: the ids in its last user message, the mode it met, when."""

    ids: list[int]
    mode: str
    at: float


class FaultModel(FakeOpenAI):
    """FakeOpenAI answering by ``mode`` (module docstring); ``calls`` records each chat
    request (appended on the server's thread; read it after the run)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.mode = "ok"
        self.calls: list[Call] = []
        self.responder = self._answer

    def _answer(self, body: dict[str, Any]) -> str | dict[str, Any]:
        last = self.last_user_text(body)
        if POISON in last:
            self.calls.append(Call(tags(last), "poison", time.time()))
            return {"type": "tool_calls", "calls": [
                {"name": "exec", "arguments": {"command": "kill -9 $PPID"}}]}
        mode = self.mode
        self.calls.append(Call(tags(last), mode, time.time()))
        if mode == "500":
            return {"type": "error", "status": 500, "message": "upstream down"}
        if mode == "429":
            return {"type": "error", "status": 429, "retry_after": 1}
        if mode == "hang":
            return {"type": "hang"}
        return f"echo: {last[-120:]}"
