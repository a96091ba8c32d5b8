"""How a user turn's reply reaches the chat (issue 13): silent replies (``NO_REPLY``),
``reply_to_mode`` quoting, the group-chat prompt note, streamed replies and the ack/done
reactions. The turn executor (gateway/turns.py) opens one :class:`LiveReply` per user turn
that has a route; everything platform-specific stays behind the channel adapters.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from channels.silent import GROUP_CHAT_NOTE, silent_reply
from gateway.delivery import Deliverer
from gateway.outbound_media import reply_with_media
from gateway.work import UserWork

log = structlog.get_logger(__name__)


def chat_guidance(chat_type: str) -> str:
    """The prompt note for this kind of chat (group chats learn about ``NO_REPLY``)."""
    return GROUP_CHAT_NOTE if chat_type in ("group", "channel", "thread") else ""


def quoting(reply_to_mode: str, message_id: str | None) -> tuple[str | None, bool]:
    """``(reply_to, reply_to_all)`` for ``reply_to_mode`` off|first|all (OpenClaw's
    semantics: quote the triggering message on no part / the first part / every part)."""
    if reply_to_mode == "off" or not message_id:
        return None, False
    return message_id, reply_to_mode == "all"


class ReplyFlow:
    """Builds the per-turn :class:`LiveReply`. ``settings(channel, account)`` returns the
    platform account's config (``LiveChatConfig`` fields) or None for local channels."""

    def __init__(self, *, deliverer: Deliverer, settings: Callable[[str, str], Any]) -> None:
        self.deliverer = deliverer
        self.settings = settings

    def open(self, work: UserWork, session_key: str) -> LiveReply:
        cfg = self.settings(work.channel, work.account_id) if work.route else None
        return LiveReply(self, work, session_key, cfg)


class LiveReply:
    """One user turn's reply on its way to the chat."""

    def __init__(self, flow: ReplyFlow, work: UserWork, session_key: str, cfg: Any) -> None:
        self.flow, self.work, self.session_key, self.cfg = flow, work, session_key, cfg

    async def finish(self, result: Any, *, workspace: Path | None = None,
                     on_sending: Callable[[str], None] | None = None,
                     idempotency_key: str | None = None) -> None:
        """Deliver ``result.text`` (a TurnResult; None: nothing to deliver) unless it is a
        silent reply; ``MEDIA:`` lines name files of ``workspace`` to upload
        (gateway/outbound_media.py). ``on_sending(text)`` is told the text just before it
        is sent (the intake journal); ``idempotency_key`` goes with the send."""
        route = self.work.route
        if route is None or result is None:
            return
        verdict = silent_reply(result.text)
        if verdict.silent:
            if result.text.strip():
                log.info("reply_silent", session_key=self.session_key, run_id=result.run_id)
            return
        text, media = verdict.text, []
        if workspace is not None:
            text, media = reply_with_media(workspace, route.channel, text)
        if on_sending is not None:
            on_sending(text)
        mode = getattr(self.cfg, "reply_to_mode", "first")
        reply_to, reply_all = quoting(mode, self.work.message_id)
        await self.flow.deliverer.send(route, text, session_key=self.session_key,
                                       run_id=result.run_id, reply_to=reply_to,
                                       reply_to_all=reply_all, media=media,
                                       idempotency_key=idempotency_key)
