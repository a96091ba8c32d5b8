"""Slack slash commands answered ephemerally (issue 13 "Commands, natively registered").

A slash command declared in the app manifest (``/new``, ``/status``...) reaches the adapter
in Socket Mode and over HTTP alike (channels/slack/inbound.py acks it once the gateway has
accepted it) and becomes the typed command ``/name args`` (channels/slack/events.py
``command_to_inbound``). Its answer — the gateway's notice that answers it, see
channels/inbound/command_replies.py — is POSTed to the payload's ``response_url`` with
``response_type: ephemeral``: only the user who ran the command sees it, and Slack shows
it even in channels the bot is not a member of. A ``response_url`` takes 5 posts within
30 minutes (https://docs.slack.dev/interactivity/handling-user-interaction); a longer
answer is split like any Slack message (channels/outbound/render.py), at most 5 parts.

Only a ``response_url`` on ``hooks.slack.com`` over https, or on the host of the
account's ``api_base_url`` (a proxy, the test fake), is ever called: the payload names
the URL, so it is checked before the gateway POSTs anything there.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import aiohttp
import structlog

from channels.base import DeliveryResult, InboundMessage
from channels.inbound.command_replies import CommandReplies, Reply
from channels.outbound.render import render_chunks
from runtime.clock import Clock, maybe_timeout

log = structlog.get_logger(__name__)

SLACK_HOOKS = "hooks.slack.com"
URL_TTL = 29 * 60.0  # s; Slack keeps a response_url for 30 minutes
MAX_POSTS = 5


def allowed_response_url(url: Any, api_base_url: str) -> bool:
    """True for ``https://hooks.slack.com/...`` or a URL on ``api_base_url``'s host."""
    if not isinstance(url, str):
        return False
    parts, api = urlsplit(url), urlsplit(api_base_url)
    if parts.scheme == "https" and parts.hostname == SLACK_HOOKS:
        return True
    return bool(parts.netloc) and (parts.scheme, parts.netloc) == (api.scheme, api.netloc)


def response_reply(session: aiohttp.ClientSession, url: str, *, clock: Clock,
                   timeout: float) -> Reply:
    """``reply(text)``: POST ``text`` (Slack mrkdwn, split at Slack's limit, at most 5
    parts) to ``url`` as ephemeral responses. ok=False (nothing shown) when the first
    post fails."""
    async def reply(text: str) -> DeliveryResult:
        parts = [c.formatted for c in render_chunks(text, "slack")][:MAX_POSTS] or ["(empty)"]
        done = 0
        try:
            async with maybe_timeout(clock, timeout):
                for part in parts:
                    body = {"response_type": "ephemeral", "text": part,
                            "replace_original": False}
                    async with session.post(url, json=body) as resp:
                        if resp.status != 200:
                            raise aiohttp.ClientResponseError(
                                resp.request_info, (), status=resp.status,
                                message=(await resp.text())[:100])
                    done += 1
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if not done:
                return DeliveryResult(ok=False, error=error, retryable=True)
            log.warning("slack_command_response_failed", parts_sent=done, parts=len(parts),
                        error=error)
        return DeliveryResult(ok=True, message_ids=[f"response:{i}" for i in range(done)])
    return reply


def expect_answer(replies: CommandReplies, msg: InboundMessage, payload: dict[str, Any], *,
                  session: aiohttp.ClientSession | None, api_base_url: str, clock: Clock,
                  timeout: float, account_id: str) -> object | None:
    """Register the command ``msg`` (from ``payload``) to be answered at its
    ``response_url``; returns the handle (CommandReplies.settle), or None (answered in the
    conversation as usual) when the payload has none or names a host we do not call."""
    url = payload.get("response_url")
    if session is None or not allowed_response_url(url, api_base_url):
        if url is not None:
            log.warning("slack_response_url_refused", account_id=account_id,
                        host=urlsplit(str(url)).hostname)
        return None
    to = msg.group_id if msg.chat_type != "dm" else msg.peer_id
    handle = replies.expect(str(to), msg.thread_id, response_reply(session, url, clock=clock,
                                                                   timeout=timeout),
                            message_id=msg.message_id)
    log.info("slack_command", account_id=account_id, command=payload.get("command"),
             chat_type=msg.chat_type, sender_id=msg.sender_id)
    return handle
