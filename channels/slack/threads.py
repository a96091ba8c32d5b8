"""Slack ``reply_in_thread`` (issue 13 "Reply modes and threading"): a top-level message in
a channel that becomes a turn is answered in a thread of that message, and the turn already
runs in that thread's session, so the follow-ups written in the thread (``thread_ts`` =
the message's ``ts``) continue the same conversation."""

from __future__ import annotations

from dataclasses import replace

from channels.base import InboundMessage


def answer_in_thread(msg: InboundMessage) -> InboundMessage:
    """``msg`` moved into the thread rooted at itself (chat_type ``thread``, ``thread_id``
    = its ``ts``) when it is a top-level channel message; any other message unchanged."""
    if msg.chat_type not in ("group", "channel") or msg.thread_id or not msg.message_id:
        return msg
    ts = msg.message_id.rpartition(":")[2] or msg.message_id
    return replace(msg, chat_type="thread", thread_id=ts)
