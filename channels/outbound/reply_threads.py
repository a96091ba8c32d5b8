"""``reply_in_thread`` (issue 13 "Reply modes and threading"): a top-level message in a
channel that becomes a turn is answered in a thread of that message, and the turn already
runs in that thread's session, so the follow-ups written in the thread continue the same
conversation.

Both platforms name such a thread after its starting message: Slack's ``thread_ts`` is the
message's ``ts``; a Discord thread started from a message has the message's id
(channels/discord/threads.py creates it when the first reply goes out).
"""

from __future__ import annotations

from dataclasses import replace

from channels.base import InboundMessage


def answer_in_thread(msg: InboundMessage) -> InboundMessage:
    """``msg`` moved into the thread rooted at itself (chat_type ``thread``, ``thread_id``
    = its id: the part after the last ``:`` of ``message_id``, Slack's ``<channel>:<ts>``)
    when it is a top-level channel message; any other message unchanged."""
    if msg.chat_type not in ("group", "channel") or msg.thread_id or not msg.message_id:
        return msg
    root = msg.message_id.rpartition(":")[2] or msg.message_id
    return replace(msg, chat_type="thread", thread_id=root)
