"""Silent replies: the agent answers ``NO_REPLY`` to send nothing (OpenClaw's silent token).

Rules (README "Silent replies"), the token being case-sensitive:

- The reply *starts* or *ends* with the token — alone, with whitespace around it, wrapped
  in markdown emphasis/code (``**NO_REPLY**``, ```NO_REPLY```, ``_NO_REPLY_``) or followed
  by punctuation — -> silent: nothing is delivered (the turn stays in the transcript and
  the timeline). Text beside an edge token is the model's private note and is dropped too.
- The token anywhere else (mid-sentence) -> the reply is delivered with the token removed.
- ``no_reply`` or ``NO_REPLYING`` are not the token.

The same rules hold for ``HEARTBEAT_OK`` in a user turn's reply (a streamed or final reply
that turns out to be the heartbeat ack is never delivered).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

SILENT_TOKEN = "NO_REPLY"
HEARTBEAT_TOKEN = "HEARTBEAT_OK"
TOKENS = (SILENT_TOKEN, HEARTBEAT_TOKEN)

# Told to the model in group-chat turns (dynamic prompt block, "Group chat").
GROUP_CHAT_NOTE = (
    "You are in a group chat where people also talk to each other. When a message needs "
    f"no answer from you, reply with exactly {SILENT_TOKEN} (nothing else) and nothing "
    "will be sent.")

_WRAP = r"[*_`~]{0,3}"
_PUNCT = r"[.!?。！]*"


@dataclass(frozen=True, slots=True)
class SilentVerdict:
    """``silent``: deliver nothing; else ``text`` is what to deliver (token removed)."""

    silent: bool
    text: str


@functools.cache  # compiled by the first reply that carries the token (issue 9, cold start)
def _patterns(token: str) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    tok = re.escape(token)
    start = re.compile(rf"^\s*{_WRAP}{tok}(?![A-Za-z0-9]){_PUNCT}{_WRAP}")
    end = re.compile(rf"(?<![A-Za-z0-9]){_WRAP}{tok}{_PUNCT}{_WRAP}{_PUNCT}\s*$")
    mid = re.compile(rf"[ \t]*(?<![A-Za-z0-9]){_WRAP}{tok}(?![A-Za-z0-9]){_WRAP}")
    return start, end, mid


def silent_reply(text: str, tokens: tuple[str, ...] = TOKENS) -> SilentVerdict:
    """Classify a reply per the module rules. ``tokens``: which silent tokens count."""
    if not text or not text.strip():
        return SilentVerdict(True, "")
    out = text
    for token in tokens:
        if token not in out:
            continue
        start, end, mid = _patterns(token)
        if start.match(out) or end.search(out):
            return SilentVerdict(True, "")
        out = mid.sub("", out)
    return SilentVerdict(not out.strip(), out.strip() if out is not text else out)


def may_become_silent(text: str, tokens: tuple[str, ...] = TOKENS) -> bool:
    """True while a streamed reply's beginning could still be a leading silent token
    (``""``, ``"**NO_R"``, ``"NO_REPLY"``...): the stream shows nothing yet."""
    head = text.lstrip().lstrip("*_`~")
    if not head:
        return True
    return any(token.startswith(head[:len(token)]) for token in tokens)
