"""Outbound half of the Discord adapter (``DiscordChannel`` in channels/discord/adapter.py):
messages, channel-tool actions, reactions, streamed replies and typing, through the
connected discord.py client (channels/discord/send.py, stream.py, actions.py).
"""

from __future__ import annotations

from typing import Any

import discord
import structlog

from channels.base import DeliveryResult, OutboundMessage
from channels.discord.actions import run_action
from channels.discord.rest import shielded
from channels.discord.send import resolve_target, send_message, typing_once
from channels.discord.stream import DiscordStream
from runtime.clock import maybe_timeout

log = structlog.get_logger(__name__)


class DiscordSending:
    """The ``Channel`` protocol's outbound methods (mixed into ``DiscordChannel``)."""

    _clock: Any
    _config: Any
    _command_replies: Any
    _reply_threads: Any
    account_id: str
    state: str

    def _ready_client(self) -> discord.Client | None:
        client = self._client
        if client is None or client.is_closed() or client.user is None:
            return None
        return client

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        """Send ``message.text`` (model Markdown) as Discord messages of <= 2000 characters
        to ``thread_id`` if set, else ``to`` (a channel id, or a user id for DMs: the DM
        channel is opened); the first part replies to ``reply_to``. 429 is honoured (by
        discord.py up to 30 s, longer waits via the clock); network/5xx/timeout ->
        ok=False, retryable=True; a bad token or a 4xx -> retryable=False. A notice that
        answers a slash command goes to its interaction instead, ephemeral
        (channels/inbound/command_replies.py)."""
        answered = await self._command_replies.answer(message)
        if answered is not None:
            return answered
        if self.state == "failed":
            return DeliveryResult(ok=False, retryable=False,
                                  error=f"discord account {self.account_id} failed: "
                                        f"{self._last_error}")
        client = self._ready_client()
        if client is None:
            return DeliveryResult(ok=False, retryable=True,
                                  error=f"discord account {self.account_id} is not connected "
                                        f"(state {self.state})")
        result = await self._send_prepared(client, message)
        if not result.ok and not result.message_ids and self._config.reply_in_thread \
                and self._reply_threads.adopt(message, result.error):
            result = await self._send_prepared(client, message)  # now opens the thread
        if not result.ok:
            result.error = self._redact(result.error or "delivery failed")
            log.warning("discord_send_failed", account_id=self.account_id, to=message.to,
                        thread_id=message.thread_id, error=result.error,
                        retryable=result.retryable, parts_sent=len(result.message_ids))
        return result

    async def _send_prepared(self, client: discord.Client,
                             message: OutboundMessage) -> DeliveryResult:
        try:  # reply_in_thread: the thread is opened by the first reply (threads.py)
            message = await self._reply_threads.prepare(client, message, clock=self._clock,
                                                        timeout=self._config.send_timeout)
        except Exception as exc:  # noqa: BLE001 - 5xx / network: the outbox retries it
            return DeliveryResult(ok=False, retryable=True,
                                  error=f"opening the reply thread: {self._describe(exc)}")
        return await send_message(client, message, clock=self._clock,
                                  timeout=self._config.send_timeout,
                                  dm_channels=self._dm_channels)

    async def resend_unknown(self, message: OutboundMessage, since: float) -> DeliveryResult:
        """Send ``message`` whose earlier send may have arrived: its parts carry the same
        nonces (same idempotency key and text), so Discord returns what it already
        created instead of a copy (``enforce_nonce``; Discord keeps nonces for minutes,
        ``since`` is not needed)."""
        return await self.send(message)

    async def act(self, action: str, route: Any, args: dict[str, Any]) -> str:
        """A channel tool's action in the route's channel (channels/discord/actions.py).
        Raises RuntimeError when not connected or Discord refuses."""
        client = self._ready_client()
        if client is None:
            raise RuntimeError(f"discord account {self.account_id} is not connected")
        thread = self._reply_threads.where(route.thread, args.get("message_id"))
        channel_id = await resolve_target(client, route.to, thread, self._dm_channels,
                                          clock=self._clock,
                                          timeout=self._config.send_timeout)
        return await shielded(run_action(client, action, channel_id, args))

    async def react(self, to: str, thread_id: str | None, message_id: str, emoji: str, *,
                    remove: bool = False) -> None:
        """Add (or remove) the bot's ``emoji`` reaction on ``message_id`` (PUT/DELETE
        /channels/{id}/messages/{id}/reactions/{emoji}/@me). Raises on failure."""
        client = self._ready_client()
        if client is None:
            return
        thread_id = self._reply_threads.where(thread_id, message_id)
        target = await resolve_target(client, to, thread_id, self._dm_channels,
                                      clock=self._clock, timeout=self._config.send_timeout)
        msg = client.get_partial_messageable(target).get_partial_message(int(message_id))
        async with maybe_timeout(self._clock, self._config.send_timeout):
            if remove:
                await shielded(msg.remove_reaction(emoji, discord.Object(id=client.user.id)))
            else:
                await shielded(msg.add_reaction(emoji))

    def stream_sender(self, message: OutboundMessage, chat_type: str, *,
                      mode: str = "partial", recipient: str | None = None) -> Any:
        """A sender for one streamed reply (channels/discord/stream.py); None while not
        connected."""
        client = self._ready_client()
        if client is None or self.state == "failed":
            return None
        timeout = self._config.send_timeout

        async def prepare(msg: OutboundMessage) -> OutboundMessage:
            return await self._reply_threads.prepare(client, msg, clock=self._clock,
                                                     timeout=timeout)
        return DiscordStream(client, message, dm_channels=self._dm_channels,
                             clock=self._clock, timeout=timeout, prepare=prepare)

    async def typing(self, to: str, thread_id: str | None = None) -> None:
        """Trigger the typing indicator once (POST /channels/{id}/typing, lasts ~10 s);
        failures are logged at debug and ignored."""
        client = self._ready_client()
        if client is None:
            return
        thread_id = self._reply_threads.where(thread_id)  # not opened yet: the channel
        try:
            target = await resolve_target(client, to, thread_id, self._dm_channels,
                                          clock=self._clock,
                                          timeout=self._config.send_timeout)
            await typing_once(client, target, clock=self._clock,
                              timeout=self._config.send_timeout)
        except Exception as exc:  # noqa: BLE001 - typing is cosmetic
            log.debug("discord_typing_failed", account_id=self.account_id, to=to,
                      error=self._describe(exc))
