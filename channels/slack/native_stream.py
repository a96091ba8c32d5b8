"""Slack's native streaming for channels/outbound/streaming.py: ``chat.startStream`` opens the
message, ``chat.appendStream`` adds what the model wrote since, ``chat.stopStream``
finalises it (https://docs.slack.dev/reference/methods/chat.startStream,
.../chat.appendStream, .../chat.stopStream). Used for replies in threads (streamed messages
are replies to a user request); elsewhere channels/slack/stream.py edits a posted message.

The API only appends and takes standard Markdown (``markdown_text``, Slack renders it), so
this sender receives the model's raw text (``markdown = True``) and sends the new suffix.
When a later model round rewrites the interim text (it no longer extends what was sent),
the message is stopped and deleted and a new stream starts. ``markdown_text`` is at most
12,000 characters a call: longer suffixes go out in several appends. Outside a DM Slack
needs ``recipient_user_id`` and ``recipient_team_id``. Errors map as in
channels/slack/send.py ``post_message`` (429 -> RateLimited). Every call takes its slot from
the account's ``TierPacer`` (channels/slack/pacing.py: appendStream Tier 4, start/stop
Tier 2, shared by every reply streaming in the workspace).
"""

from __future__ import annotations

from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.pacing import TierPacer, paced
from channels.slack.send import post_message
from runtime.clock import Clock

FIELD_LIMIT = 12_000  # characters of markdown_text per call


class SlackNativeStream:
    """One streamed reply in ``channel`` / thread ``thread_ts`` through Slack's chat
    streaming API."""

    platform = "slack"
    markdown = True  # channels/outbound/streaming.py hands over the raw model text

    def __init__(self, web: AsyncWebClient, *, channel: str, thread_ts: str, clock: Clock,
                 timeout: float, recipient_user_id: str | None = None,
                 recipient_team_id: str | None = None, pacer: TierPacer | None = None) -> None:
        self.web, self.channel, self.thread_ts = web, channel, thread_ts
        self.pacer = pacer
        self.clock, self.timeout = clock, timeout
        self.recipient = {"recipient_user_id": recipient_user_id,
                          "recipient_team_id": recipient_team_id}
        self.ts: dict[int, str] = {}
        self.sent: dict[int, str] = {}  # text the message shows
        self.stopped: set[int] = set()

    async def _call(self, method: str, **args: Any) -> str:
        body = {k: v for k, v in args.items() if v is not None}
        return await paced(self.pacer, method, self.channel, lambda: post_message(
            self.web, body, clock=self.clock, timeout=self.timeout, method=method))

    async def _start(self, index: int, text: str) -> None:
        head, rest = text[:FIELD_LIMIT], text[FIELD_LIMIT:]
        self.ts[index] = await self._call("chat_startStream", channel=self.channel,
                                          thread_ts=self.thread_ts, markdown_text=head or None,
                                          **self.recipient)
        self.sent[index] = head
        await self._append(index, rest)

    async def _append(self, index: int, suffix: str) -> None:
        for i in range(0, len(suffix), FIELD_LIMIT):
            piece = suffix[i:i + FIELD_LIMIT]
            await self._call("chat_appendStream", channel=self.channel, ts=self.ts[index],
                             markdown_text=piece)
            self.sent[index] += piece

    async def show(self, index: int, text: str, *, formatted: bool, final: bool) -> None:
        shown = self.sent.get(index)
        if shown is not None and not text.startswith(shown):
            await self.discard(index)  # rewritten: the stream cannot take text back
            shown = None
        if shown is None:
            await self._start(index, text)
        elif len(text) > len(shown):
            if not final and self.pacer is not None and \
                    self.pacer.skip_interim("chat_appendStream"):
                return  # the budget is spent: the next append carries this text too
            await self._append(index, text[len(shown):])
        if final and index not in self.stopped:
            await self._call("chat_stopStream", channel=self.channel, ts=self.ts[index])
            self.stopped.add(index)

    async def discard(self, index: int) -> None:
        ts = self.ts.pop(index, None)
        self.sent.pop(index, None)
        if ts is None:
            return
        if index not in self.stopped:
            await self._call("chat_stopStream", channel=self.channel, ts=ts)
        self.stopped.discard(index)
        await self._call("chat_delete", channel=self.channel, ts=ts)
