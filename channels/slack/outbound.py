"""Outbound half of the Slack adapter (``SlackChannel`` in channels/slack/adapter.py):
posts, uploads, channel-tool actions, reactions, streamed replies, the assistant-thread
status and thread history, through the adapter's ``AsyncWebClient``
(channels/slack/send.py, media.py, stream.py, native_stream.py, history.py).
"""

from __future__ import annotations

from typing import Any

import structlog

from channels.base import DeliveryResult, OutboundMessage
from channels.inbound.thread_history import render as render_thread
from channels.slack.actions import run_action
from channels.slack.history import fetch_thread
from channels.slack.media import upload_files
from channels.slack.native_stream import SlackNativeStream
from channels.slack.pacing import NATIVE_START_WAIT
from channels.slack.reactions import slack_emoji_name
from channels.slack.send import send_text
from channels.slack.stream import SlackStream

log = structlog.get_logger(__name__)


class SlackSending:
    """The ``Channel`` protocol's outbound methods (mixed into ``SlackChannel``)."""

    _clock: Any
    _web: Any
    _bot: Any
    _dm_channels: dict[str, str]
    _typing: Any
    _command_replies: Any
    _pacer: Any  # channels/slack/pacing.py TierPacer, shared by the account's streams
    _names: Any
    config: Any
    account_id: str
    state: str

    async def resend_unknown(self, message: OutboundMessage, since: float) -> DeliveryResult:
        """Send ``message`` whose earlier send (from ``since``, epoch s) may have arrived:
        each part is looked up first (channels/slack/send.py ``find_posted``) and posted
        only when it is not there."""
        return await self.send(message, look_first_since=since)

    async def send(self, message: OutboundMessage, *,
                   look_first_since: float | None = None) -> DeliveryResult:
        """Post ``message.text`` into ``message.to`` (channel id, or a user id for a DM),
        in thread ``message.thread_id`` when set. Slack has no quote-reply, so
        ``reply_to`` is not used. Long text goes out as several posts (Slack's 4000-char
        guideline); rate limits wait ``Retry-After``; rejected formatting is resent plain
        (channels/slack/send.py). Network/5xx failures return ok=False, retryable=True;
        token/channel errors retryable=False. A notice that answers a slash command goes
        to its ``response_url``, ephemeral (channels/slack/commands.py)."""
        answered = await self._command_replies.answer(message)
        if answered is not None:
            return answered
        if self._web is None or self.state in ("stopped", "disabled"):
            return DeliveryResult(ok=False, error="slack channel is not running",
                                  retryable=self.state != "disabled")
        if self.state == "failed":
            return DeliveryResult(ok=False, error=f"slack channel failed: {self._last_error}")
        channel = self._dm_channels.get(message.to, message.to)
        result = DeliveryResult(ok=True)
        if message.text.strip() or not message.media:
            result = await send_text(self._web, message.text, channel=channel,
                                     thread_ts=message.thread_id, clock=self._clock,
                                     timeout=self.config.send_timeout,
                                     bot_user_id=self._bot.user_id if self._bot else None,
                                     look_first_since=look_first_since)
        if result.ok and message.media:
            result = await upload_files(self._web, message.media, channel=channel,
                                        thread_ts=message.thread_id, result=result)
        log.info("slack_sent" if result.ok else "slack_send_failed",
                 account_id=self.account_id, session_key=message.session_key,
                 to=channel, thread_id=message.thread_id, sent=len(result.message_ids),
                 retryable=result.retryable, error=result.error)
        return result

    async def act(self, action: str, route: Any, args: dict[str, Any]) -> str:
        """A channel tool's action in the route's conversation (channels/slack/actions.py).
        Raises RuntimeError when not connected or Slack refuses."""
        if self._web is None or self.state != "connected":
            raise RuntimeError("slack channel is not connected")
        return await run_action(self._web, action, self._dm_channels.get(route.to, route.to),
                                args)

    async def react(self, to: str, thread_id: str | None, message_id: str, emoji: str, *,
                    remove: bool = False) -> None:
        """``reactions.add`` / ``reactions.remove`` on ``message_id`` (``<channel>:<ts>``)
        with the Slack name of ``emoji`` (channels/slack/reactions.py). Raises on
        failure."""
        if self._web is None:
            return
        channel, _, ts = message_id.rpartition(":")
        call = self._web.reactions_remove if remove else self._web.reactions_add
        await call(channel=channel or self._dm_channels.get(to, to), timestamp=ts,
                   name=slack_emoji_name(emoji))

    def stream_sender(self, message: OutboundMessage, chat_type: str, *,
                      mode: str = "partial", recipient: str | None = None) -> Any:
        """A sender for one streamed reply; None while the adapter is not running. A
        ``partial`` reply in a thread uses Slack's chat streaming API
        (channels/slack/native_stream.py, ``native_streaming``), otherwise the message is
        posted and edited (channels/slack/stream.py), also when chat.startStream's tier
        budget would hold the reply back (channels/slack/pacing.py). ``recipient``: the
        user it answers."""
        if self._web is None or self.state in ("stopped", "disabled", "failed"):
            return None
        channel = self._dm_channels.get(message.to, message.to)
        if mode == "partial" and message.thread_id and self.config.native_streaming \
                and self._pacer.delay("chat_startStream") <= NATIVE_START_WAIT:
            return SlackNativeStream(
                self._web, channel=channel, thread_ts=message.thread_id, clock=self._clock,
                timeout=self.config.send_timeout, recipient_user_id=recipient,
                recipient_team_id=self._bot.team_id if self._bot else None,
                pacer=self._pacer)
        return SlackStream(self._web, channel=self._dm_channels.get(message.to, message.to),
                           thread_ts=message.thread_id, clock=self._clock,
                           timeout=self.config.send_timeout,
                           bot_user_id=self._bot.user_id if self._bot else None,
                           pacer=self._pacer)

    async def typing(self, to: str, thread_id: str | None = None) -> None:
        """Slack has no typing indicator for bots: in a thread this sets the assistant
        thread status (see ``TypingStatus``); elsewhere it is a no-op. Never raises."""
        if self._typing is not None:
            await self._typing.show(self._dm_channels.get(to, to), thread_id)

    async def thread_history(self, to: str, thread_id: str, *, before: str | None) -> str:
        """The thread so far (root and replies before message id ``before``), bounded by
        ``thread_history``/``thread_history_chars`` and rendered as a marked block
        (``channels.inbound.thread_history``); "" when off, empty or unavailable. Never raises."""
        if self._web is None or self.config.thread_history <= 0:
            return ""
        before_ts = before.rsplit(":", 1)[-1] if before else None
        if before_ts == thread_id:
            return ""  # the message is the root itself (reply_in_thread): nothing before it
        msgs, omitted = await fetch_thread(
            self._web, self._clock, channel=self._dm_channels.get(to, to), thread_ts=thread_id,
            before_ts=before_ts, bot_user_id=self._bot.user_id if self._bot else None,
            names=self._names, limit=self.config.thread_history,
            max_chars=self.config.thread_history_chars)
        log.info("slack_thread_history", account_id=self.account_id, channel=to,
                 thread_ts=thread_id, messages=len(msgs), omitted=omitted)
        return render_thread(msgs, omitted)
