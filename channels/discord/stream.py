"""Discord's stream sender for channels/outbound/streaming.py: send a part, grow it with message
edits (PATCH /channels/{id}/messages/{id}), delete a discarded part; errors mapped with
channels/discord/send.py ``map_error`` (429 -> RateLimited, content rejected ->
MarkupRejected)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping

import discord

from channels.base import OutboundMessage
from channels.discord.rest import shielded
from channels.discord.send import map_error, part_nonce, resolve_target, send_once
from runtime.clock import Clock, maybe_timeout


class DiscordStream:
    """Messages of one streamed reply to ``message.to`` / ``thread_id``. ``prepare`` runs
    once before the first part (reply_in_thread opens the thread; channels/discord/
    threads.py) and may change the target."""

    platform = "discord"

    def __init__(self, client: discord.Client, message: OutboundMessage, *,
                 dm_channels: MutableMapping[str, int], clock: Clock,
                 timeout: float | None,
                 prepare: Callable[[OutboundMessage], Awaitable[OutboundMessage]] | None = None
                 ) -> None:
        self.client, self.message, self.dm_channels = client, message, dm_channels
        self.prepare = prepare
        self.clock, self.timeout = clock, timeout
        self.target: int | None = None
        self.ids: dict[int, int] = {}
        self.texts: dict[int, str] = {}

    async def _channel(self) -> discord.PartialMessageable:
        if self.target is None:
            if self.prepare is not None:
                self.message = await self.prepare(self.message)
            self.target = await resolve_target(self.client, self.message.to,
                                               self.message.thread_id, self.dm_channels,
                                               clock=self.clock, timeout=self.timeout)
        return self.client.get_partial_messageable(self.target)

    def _reference(self, index: int) -> discord.MessageReference | None:
        reply = self.message.reply_to
        if not reply or not str(reply).isdigit() or (index and not self.message.reply_to_all):
            return None
        return discord.MessageReference(message_id=int(reply), channel_id=self.target,
                                        fail_if_not_exists=False)

    async def show(self, index: int, text: str, *, formatted: bool, final: bool) -> None:
        if self.texts.get(index) == text:
            return
        try:
            channel = await self._channel()
        except Exception as exc:
            raise map_error(exc, formatted) from exc
        if index not in self.ids:  # nonce: a send whose outcome is unknown is resent safely
            nonce = part_nonce(self.message.idempotency_key, f"stream part {index}")
            msg = await send_once(channel, text, nonce=nonce, reference=self._reference(index),
                                  formatted=formatted, clock=self.clock, timeout=self.timeout)
            self.ids[index] = msg.id
        else:
            try:
                async with maybe_timeout(self.clock, self.timeout):
                    await shielded(channel.get_partial_message(self.ids[index]).edit(
                        content=text))
            except Exception as exc:
                raise map_error(exc, formatted) from exc
        self.texts[index] = text

    async def discard(self, index: int) -> None:
        self.texts.pop(index, None)
        mid = self.ids.pop(index, None)
        if mid is None:
            return
        try:
            channel = await self._channel()
            async with maybe_timeout(self.clock, self.timeout):
                await shielded(channel.get_partial_message(mid).delete())
        except Exception as exc:
            raise map_error(exc) from exc
