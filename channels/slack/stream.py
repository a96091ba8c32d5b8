"""Slack's stream sender for channels/outbound/streaming.py: ``chat.postMessage`` for a new part,
``chat.update`` to grow it, ``chat.delete`` to discard it, with the error rules of
channels/slack/send.py ``post_message`` (429 -> RateLimited, formatting errors ->
MarkupRejected). Every call takes its slot from the account's ``TierPacer``
(channels/slack/pacing.py): chat.update and chat.delete are Tier 3 (50 a minute per
workspace, shared by every reply streaming there), chat.postMessage one a second per
channel."""

from __future__ import annotations

from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.pacing import TierPacer, paced
from channels.slack.send import LOOKUP_SLACK_S, escape_plain, post_message, post_once
from runtime.clock import Clock


class SlackStream:
    """Messages of one streamed reply in ``channel`` (thread ``thread_ts`` when set)."""

    platform = "slack"

    def __init__(self, web: AsyncWebClient, *, channel: str, thread_ts: str | None,
                 clock: Clock, timeout: float, bot_user_id: str | None = None,
                 pacer: TierPacer | None = None) -> None:
        self.web, self.channel, self.thread_ts = web, channel, thread_ts
        self.pacer = pacer
        self.clock, self.timeout, self.bot_user_id = clock, timeout, bot_user_id
        self.ts: dict[int, str] = {}
        self.texts: dict[int, str] = {}

    async def _call(self, method: str, args: dict[str, Any]) -> str:
        return await paced(self.pacer, method, self.channel, lambda: post_message(
            self.web, args, clock=self.clock, timeout=self.timeout, method=method))

    async def show(self, index: int, text: str, *, formatted: bool, final: bool) -> None:
        if self.texts.get(index) == text:
            return
        args: dict[str, Any] = {"channel": self.channel, "mrkdwn": formatted,
                                "text": text if formatted else escape_plain(text)}
        if index in self.ts:
            if not final and self.pacer is not None and self.pacer.skip_interim("chat_update"):
                return  # the workspace's budget is spent: keep it for final texts
            args.pop("mrkdwn")
            await self._call("chat_update", {**args, "ts": self.ts[index]})
        else:
            if self.thread_ts:
                args["thread_ts"] = self.thread_ts
            # a post whose outcome is unknown is looked up before it is made again
            since = self.clock.time() - LOOKUP_SLACK_S
            self.ts[index] = await paced(self.pacer, "chat_postMessage", self.channel,
                                         lambda: post_once(self.web, args, since=since,
                                                           bot_user_id=self.bot_user_id,
                                                           clock=self.clock,
                                                           timeout=self.timeout))
        self.texts[index] = text

    async def discard(self, index: int) -> None:
        self.texts.pop(index, None)
        ts = self.ts.pop(index, None)
        if ts is not None:
            await self._call("chat_delete", {"channel": self.channel, "ts": ts})
