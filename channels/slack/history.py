"""Slack thread history for a thread session's first turn (issue 8 item 8), fetched with
``conversations.replies`` (https://docs.slack.dev/reference/methods/conversations.replies):
the root and the replies before the current message, at most ``MAX_PAGES`` pages, then
bounded by ``channels.inbound.thread_history.bound``. Names come from the ``users.info`` cache.
Never raises: on any failure the thread history is empty (logged), the turn still runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.inbound.thread_history import ThreadMessage, bound
from channels.slack.api import UserNames, api_failure, describe_error
from runtime.clock import Clock, maybe_timeout

log = structlog.get_logger(__name__)

MAX_PAGES = 5
PAGE_SIZE = 200


async def fetch_thread(web: AsyncWebClient, clock: Clock, *, channel: str, thread_ts: str,
                       before_ts: str | None, bot_user_id: str | None,
                       names: UserNames | None, limit: int, max_chars: int,
                       timeout: float = 10.0) -> tuple[list[ThreadMessage], int]:
    """(bounded messages oldest first, how many earlier replies were left out)."""
    if limit <= 0:
        return [], 0
    try:
        async with maybe_timeout(clock, timeout):
            raw = await _replies(web, channel, thread_ts)
    except asyncio.CancelledError:
        raise
    except SlackApiError as exc:
        log.warning("slack_thread_history_failed", channel=channel, thread_ts=thread_ts,
                    error=api_failure(exc).describe(), hint="needs the *:history scopes")
        return [], 0
    except Exception as exc:  # noqa: BLE001 - history is context, not a reason to fail
        log.warning("slack_thread_history_failed", channel=channel, thread_ts=thread_ts,
                    error=describe_error(exc))
        return [], 0
    cutoff = float(before_ts) if before_ts else float("inf")
    earlier = [m for m in raw if _ts(m) < cutoff and (m.get("text") or "").strip()]
    items = [await _item(m, bot_user_id, names) for m in earlier]
    kept = bound(items, limit=limit, max_chars=max_chars)
    return kept, len(items) - len(kept)


async def _replies(web: AsyncWebClient, channel: str, thread_ts: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    for _ in range(MAX_PAGES):
        resp = await web.conversations_replies(channel=channel, ts=thread_ts, limit=PAGE_SIZE,
                                               **({"cursor": cursor} if cursor else {}))
        out += [m for m in resp.get("messages") or [] if isinstance(m, dict)]
        cursor = (resp.get("response_metadata") or {}).get("next_cursor")
        if not resp.get("has_more") or not cursor:
            break
    return sorted(out, key=_ts)


def _ts(m: dict[str, Any]) -> float:
    try:
        return float(m.get("ts") or 0)
    except ValueError:
        return 0.0


async def _item(m: dict[str, Any], bot_user_id: str | None,
                names: UserNames | None) -> ThreadMessage:
    user = str(m.get("user") or "")
    from_bot = bool(bot_user_id and user == bot_user_id)
    name = None
    if not from_bot and names is not None and user.startswith(("U", "W")):
        name, _ = await names.lookup(user)
    sender = name or user or str(m.get("username") or m.get("bot_id") or "unknown")
    return ThreadMessage(sender=sender, text=str(m.get("text") or ""), ts=_ts(m),
                         from_bot=from_bot)
