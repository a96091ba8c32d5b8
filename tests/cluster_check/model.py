"""The fake model of the checker: the fake OpenAI server, recording every call.

Each message the generator sends reads ``chk s<session> m<id>``; a cron job's reads
``cron-tick <job>``. A call is recorded as a :class:`Call`: the session tag and message
ids of the turn's new user messages (those after the prompt's last assistant message: one,
unless the gateway merged several into one turn), the ids of every user message of its
prompt in order (the history the gateway gave the model), and its start and end
(``time.time()`` seconds). The answer echoes the new user messages
(``echo: <text>[ + <text>...]``), so a merged turn's one reply names every message it
answers.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from tests.fakes.fake_openai import FakeOpenAI

IDS = re.compile(r"\bm(\d+)\b")
SESSION = re.compile(r"\bchk s(\d+)\b")
CRON = re.compile(r"\bcron-tick (\w+)\b")


def message_ids(text: str) -> list[int]:
    """The generator's message ids named in ``text``, in order."""
    return [int(x) for x in IDS.findall(text or "")]


@dataclass
class Call:
    """One model call: ``session`` is the session tag (``s3``, ``cron:j1``, or ``?``)."""

    session: str
    last: list[int]
    prompt: list[int]
    start: float
    end: float = 0.0
    text: str = ""
    prompt_texts: list[str] = field(default_factory=list)


def _text(content) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def new_input(body: dict) -> list[str]:
    """The texts of the user messages after the prompt's last assistant message."""
    out: list[str] = []
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "assistant":
            out = []
        elif m.get("role") == "user":
            out.append(_text(m.get("content")))
    return out


def session_of(text: str) -> str:
    m = SESSION.search(text)
    if m:
        return f"s{m.group(1)}"
    c = CRON.search(text)
    return f"cron:{c.group(1)}" if c else "?"


class RecordingModel(FakeOpenAI):
    """FakeOpenAI recording a :class:`Call` per ``/v1/chat/completions`` request in
    ``calls`` (appended when the call begins; ``end`` set when it returns). ``latency``
    (seconds) may be changed from another thread (the nemesis's slow model)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.calls: list[Call] = []
        self.responder = lambda body: "echo: " + " + ".join(new_input(body))

    async def _chat(self, request):
        body = await request.json()
        users = [_text(m.get("content")) for m in body.get("messages") or []
                 if isinstance(m, dict) and m.get("role") == "user"]
        last = " + ".join(new_input(body))
        call = Call(session=session_of(last), last=message_ids(last),
                    prompt=[i for u in users for i in message_ids(u)], start=time.time(),
                    text=last)
        self.calls.append(call)
        try:
            return await super()._chat(request)
        finally:
            call.end = time.time()
