"""Silent replies: the agent answers ``NO_REPLY`` to send nothing (OpenClaw's silent token).

Rules (README "Silent replies"), the token being case-sensitive:

- The reply *starts* or *ends* with the token — alone, with whitespace around it, wrapped
  in markdown emphasis/code (``**NO_REPLY**``, ```NO_REPLY```, ``_NO_REPLY_``), in quotes
  (``"NO_REPLY"``, ``«NO_REPLY»``, ``“NO_REPLY”``) or in HTML tags
  (``<code>NO_REPLY</code>``), or followed by punctuation — -> silent: nothing is delivered (the turn stays in the transcript and
  the timeline). Text beside an edge token is the model's private note and is dropped too.
- The token anywhere else (mid-sentence) -> the reply is delivered with the token removed,
  and with the quotes or markup wrapped around it (no ``""`` or ``<code></code>`` left).
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

# What may wrap a token: markdown emphasis/code, quotes, HTML tags (scheduler/heartbeat/
# rules.py has the same for HEARTBEAT_OK: the scheduler does not import channels).
_WRAP = r"(?:[*_`~\"'“”‘’«»„‹›「」『』]|</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?>){0,6}"
_OPENING = r"(?:\s|[*_`~\"'“”‘’«»„‹›「」『』]|<[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?>)*"
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


@functools.cache
def _opening() -> re.Pattern[str]:
    return re.compile(_OPENING)


def may_become_silent(text: str, tokens: tuple[str, ...] = TOKENS) -> bool:
    """True while a streamed reply's beginning could still be a leading silent token
    (``""``, ``"**NO_R"``, ``"NO_REPLY"``...): the stream shows nothing yet."""
    head = text[_opening().match(text).end():]  # type: ignore[union-attr]
    if not head or (head.startswith("<") and ">" not in head and len(head) < 64):
        return True  # nothing yet, or an opening tag still arriving
    return any(token.startswith(head[:len(token)]) for token in tokens)


def _open_tail(word: str, tokens: tuple[str, ...]) -> bool:
    """True when the reply's last, unfinished word may still be (part of) a token."""
    return bool(word) and (may_become_silent(word, tokens) or any(
        t in word or any(word.endswith(t[:k]) for k in range(1, len(t))) for t in tokens))


def _without_mid_tokens(text: str, tokens: tuple[str, ...]) -> str:
    for token in tokens:
        if token in text:
            text = _patterns(token)[2].sub("", text)
    return text


class SilentStream:
    """A streamed reply shown by the module rules, for surfaces that stream deltas to the
    user (OpenAI SSE, webchat, the CLI): ``push(delta)`` -> text to show now, held back
    while the reply may still become silent or its last word may be a token;
    ``round_end()`` -> the rest of a model round that called tools; ``end(reply)`` -> the
    rest of the final reply (all of it when nothing was streamed), ``""`` when silent.
    After ``end``: ``silent`` and ``reply`` (the reply as delivered). Text shown is never
    taken back, so a note before a *trailing* token has already been shown."""

    def __init__(self, tokens: tuple[str, ...] = TOKENS) -> None:
        self.tokens, self.text, self.shown = tokens, "", ""
        self.pushed, self.silent, self.reply = False, False, ""
        self.headed = False  # the round's beginning can no longer be a token (it only grows)
        self.attempts = 0

    def attempt(self) -> None:
        """The run (re)starts (its ``agent_start`` event). A second start is the same turn
        run again after its replica died or the gateway restarted: its text starts
        afresh, and only what goes past the text already shown is shown (a re-run that
        writes the same answer streams on from where the first attempt was cut off; one
        that writes something else shows nothing more, the text shown is never taken
        back)."""
        self.attempts += 1
        if self.attempts > 1:
            self.text = ""

    def push(self, delta: str) -> str:
        self.pushed = self.pushed or bool(delta)
        self.text += delta
        if not self.headed:
            if may_become_silent(self.text, self.tokens):
                return ""
            self.headed = True
        tail = self.text[len(self.text.rstrip()):] or self.text.rsplit(None, 1)[-1]
        settled = self.text[:-len(tail)] if _open_tail(tail.strip(), self.tokens) else self.text
        return self._advance(_without_mid_tokens(settled, self.tokens).strip())

    def round_end(self) -> str:
        verdict = silent_reply(self.text, self.tokens)
        out = "" if verdict.silent else self._advance(verdict.text.lstrip())
        self.text = self.shown = ""
        self.headed = False
        return out

    def end(self, reply: str) -> str:
        verdict = silent_reply(reply, self.tokens)
        self.silent, self.reply = verdict.silent, verdict.text
        if verdict.silent:
            return ""
        if not self.pushed:
            return verdict.text
        final = verdict.text.lstrip()
        if not final.startswith(self.shown):  # the reply is not what streamed: end the stream
            final = silent_reply(self.text, self.tokens).text.lstrip()
        return self._advance(final)

    def _advance(self, target: str) -> str:
        if not target.startswith(self.shown):
            return ""
        out, self.shown = target[len(self.shown):], target
        return out
