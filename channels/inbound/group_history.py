"""Group context (issue 13 "Group context and activation"): in an allowed group where
``require_mention`` is on, messages that do not mention the bot are not turns, but the last
``channels.<p>.group_history`` of them (default 30, at most ``MAX_CHARS`` characters in
all) are kept in memory, per conversation (platform, account, group, thread or forum topic;
a message that roots its own thread — Slack ``reply_in_thread`` — counts as top level),
and handed to the next mentioned turn of that conversation as a marked block. Only messages the access
policy let through as context are kept (denied groups and senders keep nothing); nothing
ever crosses to another group; nothing is persisted.

The block quotes every message as one JSON string after its sender and UTC time, so text
in it can never pose as another line of the block (the turn loop neutralises the whole
user message as well).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass

from channels.base import InboundMessage
from runtime.clock import utc_iso

DEFAULT_LIMIT = 30
MAX_CHARS = 6000  # all kept messages of one conversation together
MAX_MESSAGE_CHARS = 1000  # one message is cut here (with an ellipsis)
HEADER = "[Recent group messages, oldest first — context only, not addressed to you]"
CURRENT = "[Current message — answer this]"

Key = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class Kept:
    sender: str
    at: float
    text: str


def conversation_of(msg: InboundMessage) -> Key:
    thread = str(msg.thread_id or "")
    if thread and (msg.message_id or "").rpartition(":")[2] == thread:
        thread = ""  # the message roots its own thread (Slack reply_in_thread): top level
    return (msg.channel, msg.account_id, str(msg.group_id or ""), thread)


class GroupHistory:
    """Recent unmentioned messages per conversation, bounded in count and characters."""

    def __init__(self, max_chars: int = MAX_CHARS) -> None:
        self.max_chars = max_chars
        self._kept: dict[Key, deque[Kept]] = {}

    def keep(self, msg: InboundMessage, limit: int = DEFAULT_LIMIT) -> None:
        """Remember ``msg`` (an allowed group's unmentioned message) for its conversation."""
        if limit <= 0 or msg.chat_type == "dm" or not msg.text.strip():
            return
        text = msg.text.strip()
        if len(text) > MAX_MESSAGE_CHARS:
            text = text[:MAX_MESSAGE_CHARS] + "…"
        kept = self._kept.setdefault(conversation_of(msg), deque())
        kept.append(Kept(msg.sender_name or msg.sender_username or msg.sender_id,
                         msg.received_at, text))
        while len(kept) > limit or (len(kept) > 1
                                    and sum(len(k.text) for k in kept) > self.max_chars):
            kept.popleft()

    def take(self, msg: InboundMessage) -> list[Kept]:
        """The kept messages of ``msg``'s conversation, oldest first; forgets them."""
        return list(self._kept.pop(conversation_of(msg), ()))

    def __len__(self) -> int:
        return sum(len(v) for v in self._kept.values())


def with_history(kept: list[Kept], text: str) -> str:
    """``text`` (the mentioned message) preceded by the marked block of ``kept``."""
    if not kept:
        return text
    lines = [f"- {utc_iso(k.at) if k.at else '?'} "
             f"{json.dumps(k.sender, ensure_ascii=False)}: "
             f"{json.dumps(k.text, ensure_ascii=False)}" for k in kept]
    return "\n".join([HEADER, *lines, "", CURRENT, text])
