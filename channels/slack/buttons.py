"""Block Kit buttons on Slack (https://docs.slack.dev/reference/block-kit/block-elements/button-element,
block_actions payloads): a message with an ``actions`` block, a press (Socket Mode
``interactive`` envelope or a signed HTTP POST, both through bolt: channels/slack/inbound.py)
as a :class:`channels.base.ButtonPress`, and the buttons replaced by the outcome
(``chat.update``). The presser's short answer is an ephemeral message through the
payload's ``response_url`` (only they see it), which is checked first
(channels/slack/commands.py ``allowed_response_url``).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import structlog

from channels.base import Button, ButtonPress
from channels.slack.api import describe_error
from channels.slack.commands import allowed_response_url

log = structlog.get_logger(__name__)


def blocks_for(text: str, buttons: list[Button]) -> list[dict[str, Any]]:
    """A plain-text section and one actions block; each button's ``action_id`` and
    ``value`` are its action data."""
    elements = []
    for b in buttons:
        el: dict[str, Any] = {"type": "button", "action_id": b.action, "value": b.action,
                              "text": {"type": "plain_text", "text": b.label[:75]}}
        if b.style in ("primary", "danger"):
            el["style"] = b.style
        elements.append(el)
    return [{"type": "section", "text": {"type": "plain_text", "text": text[:2900]}},
            {"type": "actions", "block_id": "tidegate_buttons", "elements": elements}]


async def send_buttons(web: Any, to: str, text: str, buttons: list[Button]) -> str:
    """``chat.postMessage`` with buttons into ``to`` (a channel, or a user id: their DM);
    returns ``<channel>:<ts>``. Raises RuntimeError when Slack refuses."""
    try:
        resp = await web.chat_postMessage(channel=to, text=text[:2900],
                                          blocks=blocks_for(text, buttons))
    except Exception as exc:
        raise RuntimeError(f"slack refused the buttons message: {describe_error(exc)}") \
            from exc
    return f"{resp['channel']}:{resp['ts']}"


async def close_buttons(web: Any, message_id: str, text: str) -> None:
    """``chat.update`` of ``<channel>:<ts>`` to ``text`` without buttons. Raises
    RuntimeError."""
    channel, _, ts = message_id.rpartition(":")
    try:
        await web.chat_update(channel=channel, ts=ts, text=text[:2900],
                              blocks=[{"type": "section",
                                       "text": {"type": "plain_text", "text": text[:2900]}}])
    except Exception as exc:
        raise RuntimeError(f"slack refused the update: {describe_error(exc)}") from exc


def press_of(body: dict[str, Any], *, account_id: str, session: aiohttp.ClientSession | None,
             api_base_url: str) -> ButtonPress | None:
    """The press in a ``block_actions`` payload (None for anything else)."""
    actions = body.get("actions") or []
    if body.get("type") != "block_actions" or not actions:
        return None
    action = actions[0]
    user = body.get("user") or {}
    container = body.get("container") or {}
    url = body.get("response_url")

    async def answer(text: str) -> None:
        if session is None or not text or not allowed_response_url(url, api_base_url):
            return
        async with session.post(url, json={"response_type": "ephemeral",
                                           "replace_original": False, "text": text}) as r:
            if r.status != 200:
                log.warning("slack_press_answer_failed", account_id=account_id,
                            status=r.status)

    channel = str((body.get("channel") or {}).get("id") or container.get("channel_id") or "")
    ts = str(container.get("message_ts") or "")
    return ButtonPress(channel="slack", action=str(action.get("value")
                                                   or action.get("action_id") or ""),
                       sender_id=str(user.get("id") or ""), account_id=account_id,
                       sender_name=user.get("username"), to=channel,
                       message_id=f"{channel}:{ts}" if ts else None, answer=answer)
