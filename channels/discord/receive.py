"""Inbound half of the Discord adapter (``DiscordChannel`` in channels/discord/adapter.py):
discord.py events -> ``InboundMessage``/``ChannelEvent`` (normalised by
channels/discord/inbound.py) handed to the gateway's callbacks. A malformed message or
event is logged and skipped, never fatal.

The adapter's attributes used here (``_clock``, ``_config``, ``_raw``, ``_dm_channels``,
``_dm_peers``, ``_cursors``, ``_on_message``, ``_on_event``, ``account_id``) are set by
``DiscordChannel.__init__``/``start``.
"""

from __future__ import annotations

from typing import Any

import discord
import structlog

from channels.base import ChannelEvent, InboundMessage
from channels.discord import inbound as dn
from channels.discord.commands import interaction_reply, interaction_to_inbound
from channels.discord.rest import shielded
from channels.inbound.command_replies import SETTLED
from runtime.clock import maybe_timeout

log = structlog.get_logger(__name__)


class DiscordReceiving:
    """discord.py event handlers of one account (mixed into ``DiscordChannel``)."""

    _clock: Any
    _config: Any
    _reply_threads: Any  # channels/discord/threads.py
    _command_replies: Any  # channels/inbound/command_replies.py
    account_id: str

    async def _resolve_channel(self, client: discord.Client, channel: Any) -> Any:
        """An uncached thread arrives as a PartialMessageable: fetch it once so it maps to
        chat_type thread with its parent."""
        if not dn.is_uncached_thread(channel):
            return channel
        cached = client.get_channel(channel.id)
        if cached is not None:
            return cached
        try:
            async with maybe_timeout(self._clock, self._config.send_timeout):
                return await shielded(client.fetch_channel(channel.id))
        except Exception as exc:  # noqa: BLE001 - fall back to the partial channel
            log.debug("discord_channel_fetch_failed", account_id=self.account_id,
                      channel_id=str(channel.id), error=self._describe(exc))
            return channel

    def _bot_roles(self, guild: discord.Guild | None) -> tuple[int, ...]:
        role = guild.self_role if guild is not None else None
        return (role.id,) if role is not None else ()

    async def _handle_message(self, client: discord.Client, message: discord.Message) -> None:
        raw = self._raw.pop(str(message.id), None)
        me = client.user
        if me is None or message.author.id == me.id:
            return  # the bot's own messages (Discord echoes them) are dropped here
        try:
            if not dn.is_user_message(message):
                log.debug("discord_message_skipped", account_id=self.account_id,
                          message_id=str(message.id), reason=f"type {message.type.name}")
                return
            channel = await self._resolve_channel(client, message.channel)
            conv = dn.conversation_of(channel, message.guild.id if message.guild else None)
            inbound = dn.to_inbound(
                message, conv, bot_id=me.id, bot_role_ids=self._bot_roles(message.guild),
                bot_name=me.name, account_id=self.account_id,
                received_at=self._clock.time(), raw=raw)
        except Exception as exc:  # noqa: BLE001 - a malformed message is skipped, not fatal
            log.warning("discord_message_malformed", account_id=self.account_id,
                        message_id=str(message.id), error=self._describe(exc))
            return
        if inbound is None:
            log.debug("discord_message_empty", account_id=self.account_id,
                      message_id=str(message.id), hint="no content: is the message content "
                      "intent enabled in the Developer Portal?")
            return
        if self._config.reply_in_thread:
            inbound = self._reply_threads.open_for(inbound)
        if inbound.chat_type == "dm":
            self._dm_channels[inbound.sender_id] = message.channel.id
            self._dm_peers[message.channel.id] = inbound.sender_id
        if await self._emit_message(inbound) is not None:
            self._cursors.advance(str(message.channel.id), str(message.id))

    async def _emit_message(self, inbound: InboundMessage) -> str | None:
        """Hand ``inbound`` to the gateway; once it returned (journaled by then) its outcome
        ("" when it gives none), None when it raised."""
        if self._on_message is None:
            return None
        try:
            return (await self._on_message(inbound)) or ""
        except Exception:
            log.exception("discord_on_message_failed", account_id=self.account_id,
                          message_id=inbound.message_id)
            return None

    async def _emit_event(self, event: ChannelEvent) -> None:
        if self._on_event is None:
            return
        try:
            await self._on_event(event)
        except Exception:
            log.exception("discord_on_event_failed", account_id=self.account_id,
                          kind=event.kind)

    async def _handle_raw_event(self, client: discord.Client, kind: str, payload: Any) -> None:
        """Reactions, edits, deletions, pins -> ChannelEvent (None = nothing to report)."""
        if client.user is None:
            return
        try:
            event = dn.raw_event(kind, payload, client=client, bot_id=client.user.id,
                                 account_id=self.account_id, dm_peers=self._dm_peers)
        except Exception as exc:  # noqa: BLE001 - skipped like a malformed message
            log.warning("discord_event_malformed", account_id=self.account_id,
                        discord_event=kind, error=self._describe(exc))
            return
        if event is not None:
            await self._emit_event(event)

    async def _handle_command(self, client: discord.Client, interaction: discord.Interaction,
                              name: str, value: str) -> None:
        """An application command: defer (ephemeral) within Discord's 3 s, then hand it to
        the gateway as ``/name value``; its notice answers the interaction
        (channels/discord/commands.py)."""
        try:
            await shielded(interaction.response.defer(ephemeral=True, thinking=True))
        except discord.HTTPException as exc:  # expired (over 3 s) or already answered
            log.warning("discord_command_defer_failed", account_id=self.account_id,
                        interaction_id=str(interaction.id), command=name,
                        error=f"{type(exc).__name__}: {exc}")
            return
        reply, expire = interaction_reply(interaction, clock=self._clock,
                                          timeout=self._config.send_timeout)
        try:
            channel = await self._resolve_channel(client, interaction.channel)
            conv = dn.conversation_of(channel or discord.Object(id=interaction.channel_id or 0),
                                      interaction.guild_id)
            inbound = interaction_to_inbound(interaction, conv, f"/{name} {value}".strip(),
                                             account_id=self.account_id,
                                             received_at=self._clock.time())
        except Exception as exc:  # noqa: BLE001 - a malformed interaction is skipped
            log.warning("discord_command_malformed", account_id=self.account_id,
                        interaction_id=str(interaction.id), error=self._describe(exc))
            await reply(SETTLED["failed"])
            return
        if inbound.chat_type == "dm" and interaction.channel_id is not None:
            self._dm_channels[inbound.sender_id] = interaction.channel_id
            self._dm_peers[interaction.channel_id] = inbound.sender_id
        to = inbound.group_id if inbound.chat_type != "dm" else inbound.peer_id
        handle = self._command_replies.expect(str(to), inbound.thread_id, reply,
                                              message_id=inbound.message_id, on_expire=expire)
        log.info("discord_command", account_id=self.account_id, command=name,
                 interaction_id=str(interaction.id), chat_type=inbound.chat_type,
                 sender_id=inbound.sender_id)
        outcome = await self._emit_message(inbound)
        await self._command_replies.settle(handle, "failed" if outcome is None else outcome)
