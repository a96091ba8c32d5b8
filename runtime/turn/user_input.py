"""A turn's user messages written: the transcript line, the timeline's USER_INPUT, and
the message the model sees. ``r`` is the turn's :class:`runtime.turn.runner.AgentRunner`
(not imported: it imports this module)."""

from __future__ import annotations

from typing import Any

import structlog

from runtime.context.messages import user_message
from runtime.context.session_log import LogSink
from runtime.neutralize import neutralize_user_text
from runtime.providers.base import ChatMessage
from runtime.turn.types import TurnInput, UserText

log = structlog.get_logger(__name__)

Runner = Any


def append_user(r: Runner, inp: TurnInput, sink: LogSink, msgs: list[ChatMessage],
                u: UserText, max_chars: int | None = None) -> None:
    """Write ``u`` (neutralised; cut to ``max_chars`` with a note when it is longer) and
    append it to ``msgs``."""
    text = neutralize_user_text(u.text)
    extra = {k: v for k, v in (("sender", u.sender), ("messageId", u.message_id)) if v}
    if max_chars is not None and len(text) > max_chars:
        # A message larger than the model's context would otherwise drop out of the
        # context window entirely: keep its beginning and say so.
        log.warning("user_message_truncated", session_key=inp.session_key,
                    chars=len(text), kept=max_chars)
        extra["truncatedFrom"] = len(text)
        text = (text[:max_chars] + f"\n\n[... message truncated: {len(text) - max_chars} "
                f"more characters did not fit the model's context ...]")
    ts = int((u.received_at or r.clock.time()) * 1000)
    sink.append_message(user_message(text, ts, u.media, **extra))
    record_input(r, inp, u, text)
    msgs.append(ChatMessage(role="user", content=text, media=list(u.media)))


def record_input(r: Runner, inp: TurnInput, u: UserText, text: str) -> None:
    """The timeline's USER_INPUT for ``u`` (text, sender, message id, media)."""
    r.record(inp.session_id, "USER_INPUT",
             {"text": text, **({"sender": u.sender} if u.sender else {}),
              **({"message_id": u.message_id} if u.message_id else {}),
              **({"media": [m.to_dict() for m in u.media]} if u.media else {})})
