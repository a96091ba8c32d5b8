"""Outbound Slack: ``chat.postMessage`` for replies and ``assistant.threads.setStatus`` as the
closest thing Slack has to a typing indicator.

Sources: chat.postMessage (https://docs.slack.dev/reference/methods/chat.postMessage: ``text``
with ``mrkdwn``, ``thread_ts`` for threads; ``&``, ``<``, ``>`` must be escaped even when
``mrkdwn`` is off), rate limits (https://docs.slack.dev/apis/web-api/rate-limits: 429 +
``Retry-After``), assistant.threads.setStatus
(https://docs.slack.dev/reference/methods/assistant.threads.setStatus, scope
``assistant:write``). Splitting, markup and retry policy are the shared
channels/outbound/render.py and channels/outbound/delivery.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import structlog
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import DeliveryResult
from channels.outbound.delivery import DeliveryError, MarkupRejected, RateLimited, send_chunks
from channels.outbound.render import render_chunks
from channels.outbound.send_outcome import SendOutcomeUnknown, outcome_unknown
from channels.slack.api import MARKUP_ERRORS, NETWORK_ERRORS, api_failure, describe_error
from runtime.clock import Clock, maybe_timeout

log = structlog.get_logger(__name__)

TYPING_STATUS = "is typing..."
TYPING_TIMEOUT = 5.0  # s; a typing hint that takes longer is worthless
# Only for connect failures (the request never reached Slack, so it cannot have posted).
NETWORK_RETRY_DELAYS = (0.5, 1.5)
LOOKUP_LIMIT = 50  # messages read back when a post's outcome is unknown
LOOKUP_SLACK_S = 60.0  # s before the post that the lookup starts (clock skew)


def escape_plain(text: str) -> str:
    """Escape Slack's control characters for the plain fallback (Slack parses ``<…>`` and
    ``&`` even when mrkdwn is off)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


async def post_message(web: AsyncWebClient, args: dict[str, Any], *, clock: Clock,
                       timeout: float, method: str = "chat_postMessage") -> str:
    """One ``chat.postMessage`` with ``args`` (``channel``, ``text``, ``mrkdwn``,
    ``thread_ts``); returns the new message's ``ts``. ``method`` names another
    AsyncWebClient method with the same error rules (``chat_update``, ``chat_delete``).

    Raises RateLimited(retry_after s) on 429/``ratelimited``; MarkupRejected for a
    formatting error on a formatted post; DeliveryError(retryable=...) otherwise — True for
    network trouble, timeouts (``timeout`` s on ``clock``) and 5xx, False for token/channel
    errors. Connection failures are retried twice (0.5 s, 1.5 s) first.
    """
    for delay in (*NETWORK_RETRY_DELAYS, None):
        try:
            async with maybe_timeout(clock, timeout):
                resp = await getattr(web, method)(**args)
            return str(resp.get("ts") or "")
        except SlackApiError as exc:
            failure = api_failure(exc)
            if failure.rate_limited:
                wait = failure.retry_after if failure.retry_after is not None else 1.0
                raise RateLimited(wait) from None
            if args.get("mrkdwn") and failure.error in MARKUP_ERRORS:
                raise MarkupRejected(failure.describe()) from None
            raise DeliveryError(failure.describe(),
                                retryable=failure.transient and not failure.auth) from None
        except aiohttp.ClientConnectorError as exc:
            if delay is None:
                raise DeliveryError(describe_error(exc), retryable=True) from None
            await clock.sleep(delay)
        except NETWORK_ERRORS as exc:
            raise DeliveryError(describe_error(exc), retryable=True) from exc
    raise AssertionError("unreachable")


async def send_text(web: AsyncWebClient, text: str, *, channel: str, thread_ts: str | None,
                    clock: Clock, timeout: float, bot_user_id: str | None = None,
                    look_first_since: float | None = None) -> DeliveryResult:
    """Render model Markdown for Slack and post it in parts (4000 chars each) into
    ``channel``/``thread_ts``: mrkdwn first, the escaped plain twin when Slack rejects the
    markup, waiting out rate limits on ``clock``. A part whose outcome is unknown (posted,
    never answered) is looked up (:func:`find_posted`) and posted again only when it is
    not there; when the lookup fails it is unconfirmed. Returns the ``send_chunks`` result
    (ok, message ids = the posts' ``ts``, retryable, unconfirmed, remaining_text).
    ``look_first_since`` (epoch s): every part is looked up before it is posted (an
    earlier send of this text may have arrived, e.g. before a crash)."""
    try:
        chunks = render_chunks(text, "slack")
    except ValueError as exc:
        return DeliveryResult(ok=False, error=str(exc))

    async def send_part(part: str, formatted: bool) -> str:
        args: dict[str, Any] = {"channel": channel, "mrkdwn": formatted,
                                "text": part if formatted else escape_plain(part)}
        if thread_ts:
            args["thread_ts"] = thread_ts
        since = clock.time() - LOOKUP_SLACK_S
        if look_first_since is not None:
            found = await find_posted(web, args, since=look_first_since - LOOKUP_SLACK_S,
                                      bot_user_id=bot_user_id, clock=clock, timeout=timeout)
            if found is None:
                raise SendOutcomeUnknown("could not check whether it was already posted")
            if found:
                return found
        return await post_once(web, args, since=since, bot_user_id=bot_user_id,
                               clock=clock, timeout=timeout)

    return await send_chunks(chunks, send_part, clock=clock)


async def post_once(web: AsyncWebClient, args: dict[str, Any], *, since: float,
                    bot_user_id: str | None, clock: Clock, timeout: float) -> str:
    """:func:`post_message`, and when its outcome is unknown (posted, never answered) the
    post is looked up (:func:`find_posted`, posts newer than ``since`` epoch s) and made
    again only when it is not there. Returns the ``ts``; raises like post_message, or
    SendOutcomeUnknown when the lookup failed."""
    try:
        return await post_message(web, args, clock=clock, timeout=timeout)
    except Exception as exc:
        if not outcome_unknown(exc):
            raise
        found = await find_posted(web, args, since=since, bot_user_id=bot_user_id,
                                  clock=clock, timeout=timeout)
        if found is None:
            raise SendOutcomeUnknown(f"{exc}; lookup failed") from exc
        if found:
            log.info("slack_send_confirmed_by_lookup", channel=args["channel"], ts=found)
            return found
        log.info("slack_send_not_found_resending", channel=args["channel"])
        return await post_message(web, args, clock=clock, timeout=timeout)


async def find_posted(web: AsyncWebClient, args: dict[str, Any], *, since: float,
                      bot_user_id: str | None, clock: Clock, timeout: float) -> str | None:
    """The ``ts`` of a post of ours with ``args["text"]`` in ``args["channel"]`` (thread
    ``thread_ts``) newer than ``since`` (epoch s), "" when there is none, None when the
    lookup itself failed (missing ``*:history`` scope, network). A DM given by user id is
    opened first (``conversations.open``) to learn its conversation id.

    One bounded call: ``conversations.replies`` for a thread, else
    ``conversations.history``, at most LOOKUP_LIMIT messages
    (https://docs.slack.dev/reference/methods/conversations.history)."""
    channel, thread = str(args["channel"]), args.get("thread_ts")
    try:
        async with maybe_timeout(clock, timeout):
            if channel.startswith(("U", "W")):  # a DM by user id: history needs the D id
                opened = await web.conversations_open(users=channel)
                channel = str((opened.get("channel") or {}).get("id") or channel)
            query = {"channel": channel, "oldest": f"{since:.6f}", "limit": LOOKUP_LIMIT}
            resp = await (web.conversations_replies(ts=thread, **query) if thread
                          else web.conversations_history(**query))
    except Exception as exc:  # noqa: BLE001 - an unknown outcome stays unknown
        log.warning("slack_lookup_failed", channel=channel, error=describe_error(exc))
        return None
    for msg in resp.get("messages") or []:
        ours = msg.get("bot_id") or (bot_user_id and msg.get("user") == bot_user_id)
        if ours and msg.get("text") == args["text"]:
            return str(msg.get("ts") or "")
    return ""


class TypingStatus:
    """``assistant.threads.setStatus`` as a typing hint, for apps with Slack's Agents &
    Assistants feature (``assistant:write``). Only threads have a status; the first
    refusal (missing scope, not an assistant thread...) turns it off for good, so other apps
    pay one failed call per adapter lifetime. ``show`` never raises."""

    def __init__(self, web: AsyncWebClient, clock: Clock, *, account_id: str = "") -> None:
        self._web, self._clock, self._account_id = web, clock, account_id
        self.enabled = True

    async def show(self, channel: str, thread_ts: str | None) -> None:
        if not thread_ts or not self.enabled:
            return
        try:
            async with maybe_timeout(self._clock, TYPING_TIMEOUT):
                await self._web.assistant_threads_setStatus(
                    channel_id=channel, thread_ts=thread_ts, status=TYPING_STATUS)
        except SlackApiError as exc:
            failure = api_failure(exc)
            if not (failure.rate_limited or failure.transient):
                self.enabled = False
            log.debug("slack_typing_failed", account_id=self._account_id,
                      error=failure.describe(), disabled=not self.enabled)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - typing is cosmetic
            log.debug("slack_typing_failed", account_id=self._account_id,
                      error=describe_error(exc))
