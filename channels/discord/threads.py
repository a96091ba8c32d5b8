"""Discord ``reply_in_thread`` (issue 13 "Reply modes and threading": "Discord:
``reply_in_thread`` creates a thread for a guild mention when enabled").

A top-level guild-channel message that mentions the bot (or replies to it) is moved into
the thread rooted at itself (channels/outbound/reply_threads.py): a Discord thread started from a
message has that message's id, so the turn runs in the thread's session from the start and
the follow-ups written in the thread continue it. The thread is created when the first
reply goes out (``POST /channels/{channel}/messages/{message}/threads``, named after the
message's first line), not at intake: a turn that ends silent (``NO_REPLY``) or is refused
opens nothing. Until then typing shows in the channel; the starting message itself lives
in the channel, so reactions on it and the quote of it (``reply_to``) stay there — the
thread already hangs off it, so replies in the thread do not quote it again.

If Discord refuses the thread (no "Create Public Threads" permission: 403 50013, an
archived channel, ...), the reply goes to the channel instead, quoting the message as
usual; 160004 (the thread already exists: a retry, another replica) counts as created.
Network errors and 5xx propagate, so the delivery is retried.
Source: https://discord.com/developers/docs/resources/channel#start-thread-from-message
"""

from __future__ import annotations

from dataclasses import replace

import discord
import structlog

from channels.base import InboundMessage, OutboundMessage
from channels.discord.client import Bounded
from channels.discord.rest import shielded
from channels.outbound.reply_threads import answer_in_thread
from runtime.clock import Clock, maybe_timeout

log = structlog.get_logger(__name__)

ALREADY_CREATED = 160004
UNKNOWN_CHANNEL = "(code 10003)"  # as channels/discord/send.py map_error words it
NAME_CHARS = 80  # Discord allows 100
_KEEP = 2048  # threads remembered (pending or refused)


def thread_name(text: str) -> str:
    """The thread's name: the message's first non-empty line, at most 80 characters."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if len(line) > NAME_CHARS:
        line = line[:NAME_CHARS - 1].rstrip() + "…"
    return line or "Reply"


class ReplyThreads:
    """The threads this adapter promised to open. Thread ids are message ids (strings)."""

    def __init__(self) -> None:
        self._pending: Bounded = Bounded(_KEEP)  # thread id -> (parent channel id, name)
        self._refused: Bounded = Bounded(_KEEP)  # thread id -> True: reply in the parent
        self._roots: Bounded = Bounded(_KEEP)  # every thread opened here -> True

    def open_for(self, msg: InboundMessage) -> InboundMessage:
        """``msg`` moved into its (future) thread when it is a top-level guild-channel
        message addressed to the bot; any other message unchanged."""
        if not msg.mentions_bot or msg.chat_type != "channel":
            return msg
        moved = answer_in_thread(msg)
        if moved.thread_id and moved.thread_id != msg.thread_id:
            self._pending[moved.thread_id] = (str(moved.group_id), thread_name(msg.text))
            self._roots[moved.thread_id] = True
        return moved

    def adopt(self, message: OutboundMessage, error: str | None) -> bool:
        """A send into thread ``tid`` refused as an unknown channel (10003) for a thread
        this process never promised: after a restart (a resumed turn, an outbox retry)
        the promise is forgotten while the thread was never opened. Promise it again
        (named "Reply": the message text is gone) so that the next send opens it; True
        when adopted. Discord answers 10008 when ``tid`` is no message of ``message.to``
        (then the reply goes to the channel, as for any refused thread)."""
        tid = message.thread_id
        if not tid or tid in self._roots or UNKNOWN_CHANNEL not in (error or ""):
            return False
        self._pending[tid] = (str(message.to), thread_name(""))
        self._roots[tid] = True
        log.info("discord_reply_thread_adopted", channel_id=message.to, thread_id=tid)
        return True

    def where(self, thread_id: str | None, message_id: str | None = None) -> str | None:
        """The thread to act in: None (the parent channel) while the thread is not created
        yet or was refused, or when ``message_id`` is the thread's starting message."""
        if not thread_id or thread_id in self._pending or thread_id in self._refused:
            return None
        if message_id is not None and message_id == thread_id and thread_id in self._roots:
            return None
        return thread_id

    async def prepare(self, client: discord.Client, message: OutboundMessage, *,
                      clock: Clock, timeout: float | None) -> OutboundMessage:
        """``message`` ready to send: its thread created if still pending; sent to the
        parent channel when the thread was refused; no quote of the starting message
        inside the thread. Raises what Discord raises for network errors and 5xx."""
        tid = message.thread_id
        if not tid or tid not in self._roots:
            return message
        if tid in self._pending:
            await self._create(client, tid, clock=clock, timeout=timeout)
        if tid in self._refused:
            return replace(message, thread_id=None)
        if message.reply_to == tid:
            return replace(message, reply_to=None, reply_to_all=False)
        return message

    async def _create(self, client: discord.Client, tid: str, *, clock: Clock,
                      timeout: float | None) -> None:
        parent, name = self._pending[tid]
        try:
            async with maybe_timeout(clock, timeout):
                await shielded(client.http.start_thread_with_message(
                    int(parent), int(tid), name=name, auto_archive_duration=1440))
        except discord.HTTPException as exc:
            if exc.code != ALREADY_CREATED:
                if exc.status >= 500:
                    raise
                self._refused[tid] = True
                log.warning("discord_reply_thread_refused", channel_id=parent, thread_id=tid,
                            status=exc.status, code=exc.code, error=exc.text,
                            fallback="channel")
        else:
            log.info("discord_reply_thread_created", channel_id=parent, thread_id=tid)
        self._pending.pop(tid, None)
