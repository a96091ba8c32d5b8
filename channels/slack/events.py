"""Slack event payloads -> ``InboundMessage`` / ``ChannelEvent`` (pure functions, no I/O).

Implements the normalisation half of the Slack adapter (issue 3; DESIGN.md "The path of one
message", step 1) over the Events API shapes documented at
https://docs.slack.dev/reference/events (``message`` with ``channel_type`` im/mpim/group/
channel, ``app_mention``, ``message_changed``/``message_deleted`` subtypes,
``reaction_added``/``reaction_removed``, ``pin_added``) and slash-command payloads
(https://docs.slack.dev/interactivity/implementing-slash-commands).

Ids stay exactly as Slack sends them. ``message_id`` is ``"<channel>:<ts>"``: ``ts`` is unique
per channel and identical in a redelivery (Slack retries resend the same event), and an
``app_mention`` and the ``message`` event for the same post share it, so the gateway's
dedupe collapses them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from channels.base import ChannelEvent, ChatType, InboundMessage

CHANNEL = "slack"
# Subtypes that are real user/bot posts; others (joins, topic changes...) are not messages.
MESSAGE_SUBTYPES = {None, "bot_message", "thread_broadcast", "file_share", "me_message"}
SLACKBOT = "USLACKBOT"  # Slack's own bot posts with this user id and no bot_id
EVENT_TEXT_MAX = 200  # chars of message text quoted in a ChannelEvent

_LINK = re.compile(r"<([^<>]+)>")


class MalformedEvent(ValueError):
    """A Slack payload lacks a field we need or has the wrong type (logged and skipped)."""


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """Who the bot is, from ``auth.test``: ``user_id`` (U…), ``bot_id`` (B…), ``username``
    and ``team_id``."""

    user_id: str
    bot_id: str | None = None
    username: str | None = None
    team_id: str | None = None


def message_id_of(channel: str, ts: str) -> str:
    """The stable message id the adapter emits: ``"<channel>:<ts>"``."""
    return f"{channel}:{ts}"


def _str(d: dict[str, Any], key: str, *, required: bool = False) -> str | None:
    value = d.get(key)
    if value is None or value == "":
        if required:
            raise MalformedEvent(f"missing {key!r}")
        return None
    if not isinstance(value, str):
        raise MalformedEvent(f"{key!r} is {type(value).__name__}, expected str")
    return value


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedEvent(f"{what} is {type(value).__name__}, expected object")
    return value


def slack_to_text(text: str) -> str:
    """Slack message text -> plain text for the model.

    ``<url|label>`` -> ``label (url)``, ``<url>`` -> ``url``, ``<#C1|general>`` -> ``#general``,
    ``<!here>`` -> ``@here``; user mentions ``<@U1>`` stay as they are (the model can echo them
    back and Slack renders them); ``&lt; &gt; &amp;`` are unescaped last.
    """

    def link(m: re.Match[str]) -> str:
        inner = m.group(1)
        target, _, label = inner.partition("|")
        if target.startswith("@"):
            return m.group(0)
        if target.startswith("#"):
            return f"#{label}" if label else target
        if target.startswith("!"):
            name = label or target[1:].split("^", 1)[0]
            return f"@{name}"
        return f"{label} ({target})" if label and label != target else target

    out = _LINK.sub(link, text)
    return out.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _mention_pattern(bot: BotIdentity) -> re.Pattern[str]:
    return re.compile(rf"<@{re.escape(bot.user_id)}(?:\|[^>]*)?>")


def _strip_leading_mention(text: str, bot: BotIdentity) -> str:
    pat = _mention_pattern(bot)
    m = re.match(rf"\s*{pat.pattern}[\s,:]*", text)
    return text[m.end():] if m else text


def _chat_type_of(channel: str, channel_type: str | None) -> str:
    """Slack ``channel_type`` (or the id prefix when absent, as in app_mention):
    im -> dm, mpim/group (private) -> group, channel -> channel."""
    kind = channel_type or {"D": "im", "G": "group"}.get(channel[:1], "channel")
    return {"im": "dm", "mpim": "group", "group": "group"}.get(kind, "channel")


def _place(channel: str, channel_type: str | None, ts: str | None, thread_ts: str | None,
           sender: str) -> tuple[ChatType, str, str | None, str | None]:
    """(chat_type, peer_id, group_id, thread_id) for a post in ``channel``.

    A reply in a thread (``thread_ts`` != ``ts``) outside DMs is chat_type ``thread``; in a DM it
    stays ``dm`` (one session per person) but keeps ``thread_id`` so the reply lands there.
    """
    kind = _chat_type_of(channel, channel_type)
    in_thread = bool(thread_ts) and thread_ts != ts
    if kind == "dm":
        return "dm", sender, None, thread_ts if in_thread else None
    if in_thread:
        return "thread", sender, channel, thread_ts
    return kind, sender, channel, None  # type: ignore[return-value]


def is_own(event: dict[str, Any], bot: BotIdentity) -> bool:
    """True when the bot itself posted/acted (its user id or its bot id)."""
    user, bot_id = event.get("user"), event.get("bot_id")
    return (user is not None and user == bot.user_id) or (
        bot_id is not None and bot.bot_id is not None and bot_id == bot.bot_id)


def to_inbound(event: dict[str, Any], *, bot: BotIdentity, account_id: str,
               received_at: float, raw: Any = None) -> InboundMessage | None:
    """A ``message``/``app_mention`` event -> ``InboundMessage``.

    Returns None for the bot's own posts and for non-post subtypes (joins, topic changes...).
    ``sender_name``/``sender_username`` are left None (the adapter fills them from
    ``users.info``). ``received_at`` is epoch seconds. Raises ``MalformedEvent`` when
    ``channel``/``ts``/sender are missing or a field has the wrong type.
    """
    subtype = _str(event, "subtype")
    if subtype not in MESSAGE_SUBTYPES:
        return None
    channel = _str(event, "channel", required=True)
    ts = _str(event, "ts", required=True)
    sender = _str(event, "user") or _str(event, "bot_id")
    if sender is None:
        raise MalformedEvent("message has neither 'user' nor 'bot_id'")
    assert channel is not None and ts is not None
    if is_own(event, bot):
        return None
    text = event.get("text") or ""
    if not isinstance(text, str):
        raise MalformedEvent(f"'text' is {type(text).__name__}, expected str")
    thread_ts = _str(event, "thread_ts")
    chat_type, peer, group, thread = _place(channel, _str(event, "channel_type"), ts,
                                            thread_ts, sender)
    mentioned = (event.get("type") == "app_mention"
                 or bool(_mention_pattern(bot).search(text))
                 or (thread is not None and event.get("parent_user_id") == bot.user_id))
    return InboundMessage(
        channel=CHANNEL,
        account_id=account_id,
        chat_type=chat_type,
        peer_id=peer,
        group_id=group,
        thread_id=thread,
        sender_id=sender,
        sender_username=_str(event, "username") if subtype == "bot_message" else None,
        text=slack_to_text(_strip_leading_mention(text, bot)).strip(),
        mentions_bot=mentioned,
        message_id=message_id_of(channel, ts),
        reply_to=message_id_of(channel, thread_ts) if thread_ts and thread_ts != ts else None,
        received_at=received_at,
        is_bot=bool(event.get("bot_id")) or subtype == "bot_message" or sender == SLACKBOT,
        raw=raw if raw is not None else event,
    )


def _quote(text: Any) -> str:
    s = slack_to_text(text) if isinstance(text, str) else ""
    s = " ".join(s.split())
    return s if len(s) <= EVENT_TEXT_MAX else s[: EVENT_TEXT_MAX - 1] + "\u2026"


def _event(kind: str, text: str, *, account_id: str, channel: str, channel_type: str | None,
           ts: str | None, thread_ts: str | None, actor: str | None) -> ChannelEvent:
    chat_type, peer, group, thread = _place(channel, channel_type, ts, thread_ts, actor or "")
    return ChannelEvent(channel=CHANNEL, kind=kind, text=text, account_id=account_id,
                        chat_type=chat_type, peer_id=peer, group_id=group, thread_id=thread,
                        sender_id=actor)


def to_channel_event(event: dict[str, Any], *, bot: BotIdentity,
                     account_id: str) -> ChannelEvent | None:
    """An edit, deletion, reaction or pin -> ``ChannelEvent`` (kind ``edit``, ``delete``,
    ``reaction``, ``pin``) for the conversation it happened in.

    Returns None for the bot's own actions and for events of other kinds. For reactions and
    pins Slack does not say whether the message is in a thread; the event is routed to the
    channel (or the DM for ``D…`` channels). Raises ``MalformedEvent`` on missing fields.
    """
    etype = _str(event, "type", required=True)
    if etype == "message":
        subtype = _str(event, "subtype")
        channel = _str(event, "channel", required=True)
        assert channel is not None
        ctype = _str(event, "channel_type")
        if subtype == "message_changed":
            return _edit_event(event, channel, ctype, bot, account_id)
        if subtype == "message_deleted":
            return _delete_event(event, channel, ctype, bot, account_id)
        return None
    if etype in ("reaction_added", "reaction_removed"):
        return _reaction_event(event, etype, bot, account_id)
    if etype == "pin_added":
        return _pin_event(event, bot, account_id)
    return None


def _edit_event(event: dict[str, Any], channel: str, ctype: str | None, bot: BotIdentity,
                account_id: str) -> ChannelEvent | None:
    msg = _dict(event.get("message"), "'message'")
    prev = event.get("previous_message")
    if is_own(msg, bot):
        return None  # Slack edits our posts itself (link unfurls)
    old = prev.get("text") if isinstance(prev, dict) else None
    if old is not None and old == msg.get("text"):
        return None  # attachment/unfurl change, not a text edit
    ts = _str(msg, "ts", required=True)
    actor = _str(msg, "user")
    text = f'Slack: {actor or "someone"} edited message {ts}: "{_quote(msg.get("text"))}"'
    return _event("edit", text, account_id=account_id, channel=channel,
                  channel_type=ctype, ts=ts,
                  thread_ts=_str(msg, "thread_ts"), actor=actor)


def _delete_event(event: dict[str, Any], channel: str, ctype: str | None, bot: BotIdentity,
                  account_id: str) -> ChannelEvent | None:
    prev = event.get("previous_message")
    prev = prev if isinstance(prev, dict) else {}
    if is_own(prev, bot):
        return None
    ts = _str(event, "deleted_ts", required=True)
    actor = _str(prev, "user")
    text = f"Slack: message {ts} by {actor or 'someone'} was deleted"
    return _event("delete", text, account_id=account_id, channel=channel,
                  channel_type=ctype, ts=ts,
                  thread_ts=_str(prev, "thread_ts"), actor=actor)


def _reaction_event(event: dict[str, Any], etype: str, bot: BotIdentity,
                    account_id: str) -> ChannelEvent | None:
    actor = _str(event, "user", required=True)
    if actor == bot.user_id:
        return None
    item = _dict(event.get("item"), "'item'")
    if item.get("type") != "message":
        return None
    channel = _str(item, "channel", required=True)
    ts = _str(item, "ts", required=True)
    reaction = _str(event, "reaction", required=True)
    verb = "added" if etype == "reaction_added" else "removed"
    whose = " (the bot's message)" if event.get("item_user") == bot.user_id else ""
    text = f"Slack: {actor} {verb} reaction :{reaction}: on message {ts}{whose}"
    assert channel is not None
    return _event("reaction", text, account_id=account_id, channel=channel,
                  channel_type=None, ts=ts, thread_ts=None, actor=actor)


def _pin_event(event: dict[str, Any], bot: BotIdentity, account_id: str) -> ChannelEvent | None:
    actor = _str(event, "user", required=True)
    if actor == bot.user_id:
        return None
    channel = _str(event, "channel_id", required=True)
    item = _dict(event.get("item"), "'item'")
    msg = item.get("message") if isinstance(item.get("message"), dict) else {}
    assert channel is not None
    text = f'Slack: {actor} pinned a message: "{_quote(msg.get("text"))}"'
    return _event("pin", text, account_id=account_id, channel=channel, channel_type=None,
                  ts=_str(msg, "ts"), thread_ts=None, actor=actor)


def command_to_inbound(payload: dict[str, Any], *, account_id: str,
                       received_at: float) -> InboundMessage:
    """A slash-command payload (``/new``, ``/status``… declared in the app manifest) ->
    ``InboundMessage`` with text ``"/cmd args"`` for the gateway's central command handling.

    ``message_id`` is ``"<channel_id>:<trigger_id>"``. Raises ``MalformedEvent`` when
    ``command``, ``user_id`` or ``channel_id`` is missing.
    """
    command = _str(payload, "command", required=True)
    user = _str(payload, "user_id", required=True)
    channel = _str(payload, "channel_id", required=True)
    assert command is not None and user is not None and channel is not None
    args = payload.get("text") if isinstance(payload.get("text"), str) else ""
    trigger = _str(payload, "trigger_id") or ""
    chat_type, peer, group, _ = _place(channel, None, None, None, user)
    return InboundMessage(
        channel=CHANNEL, account_id=account_id, chat_type=chat_type, peer_id=peer,
        group_id=group, sender_id=user, sender_username=_str(payload, "user_name"),
        text=f"{command} {args}".strip(), mentions_bot=True,
        message_id=message_id_of(channel, trigger), received_at=received_at, raw=payload,
    )
