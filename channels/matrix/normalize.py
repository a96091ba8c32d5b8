"""Matrix room events (client-server API JSON, as ``/sync`` returns them) ->
``InboundMessage`` / ``ChannelEvent``.

- ``m.room.message`` (``m.text``, ``m.notice``, ``m.emote``, and ``m.image``/``m.file``/
  ``m.audio``/``m.video`` with an ``mxc://`` url) becomes an InboundMessage; an edit
  (``m.replace``) becomes an ``edit`` event instead, a notice from another bot is ignored
  unless ``allow_bots``.
- chat type: ``dm`` in a direct room, else ``group``; a message in a thread
  (``m.relates_to.rel_type == "m.thread"``) is ``thread`` with the root event id as
  ``thread_id`` (in a DM it stays ``dm`` and keeps ``thread_id`` for the reply).
- ``mentions_bot``: the bot's user id in ``m.mentions.user_ids`` (intentional mentions,
  spec v1.7), a ``matrix.to`` link to it or its user id in the text, its display name
  in a message without ``m.mentions``, or a reply to one of the bot's events.
- ``m.reaction`` (``m.annotation``) becomes a ``reaction`` event, ``m.room.redaction`` a
  ``delete`` event.

Spec: https://spec.matrix.org/v1.11/client-server-api/#mroommessage-msgtypes, threads
#threading, edits #event-replacements, reactions #event-annotations-and-reactions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from channels.base import ChannelEvent, InboundMessage
from channels.media import InboundMedia

MEDIA_KINDS = {"m.image": "image", "m.file": "document", "m.audio": "audio",
               "m.video": "video"}
TEXT_TYPES = ("m.text", "m.notice", "m.emote")


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """The logged-in account: ``user_id`` (``@bot:hs``) and its display name."""

    user_id: str
    display_name: str | None = None


@dataclass(slots=True)
class RoomView:
    """What normalisation needs of a room: its id, whether it is a DM, its members'
    display names (``names``), and whether an event id is one the bot sent
    (``is_bot_event``)."""

    room_id: str
    is_dm: bool
    names: dict[str, str]
    is_bot_event: Callable[[str], bool]


def relation(content: dict[str, Any]) -> dict[str, Any]:
    rel = content.get("m.relates_to")
    return rel if isinstance(rel, dict) else {}


def reply_target(content: dict[str, Any]) -> str | None:
    """The event id a message replies to (``m.in_reply_to``; in a thread only when it
    is a real reply, not the thread fallback)."""
    rel = relation(content)
    if rel.get("rel_type") == "m.thread" and rel.get("is_falling_back"):
        return None
    target = rel.get("m.in_reply_to")
    event_id = target.get("event_id") if isinstance(target, dict) else None
    return event_id if isinstance(event_id, str) else None


def _strip_reply_fallback(body: str) -> str:
    # Older clients quote the replied-to message as leading "> " lines (spec before v1.13).
    lines = body.split("\n")
    if lines and lines[0].startswith("> <"):
        while lines and lines[0].startswith(">"):
            lines.pop(0)
        while lines and not lines[0].strip():
            lines.pop(0)
    return "\n".join(lines)


def strip_leading_mention(text: str, identity: BotIdentity) -> str:
    """``text`` without a leading ``<bot id or name>:`` / ``,`` (what clients put before a
    message that mentions the bot: Element writes the pill's display name)."""
    for name in (identity.user_id, identity.display_name):
        if name and text[:len(name)].lower() == name.lower():
            rest = text[len(name):]
            if rest[:1] in (":", ",") or (rest[:1] == " " and name == identity.user_id):
                return rest[1:].lstrip()
    return text


def mentions_bot(content: dict[str, Any], identity: BotIdentity, room: RoomView) -> bool:
    """Whether the message addresses the bot (see the module docstring)."""
    mentions = content.get("m.mentions")
    if isinstance(mentions, dict):
        ids = mentions.get("user_ids")
        if isinstance(ids, list) and identity.user_id in ids:
            return True
    body = str(content.get("body") or "")
    formatted = str(content.get("formatted_body") or "")
    if identity.user_id in body or f"matrix.to/#/{identity.user_id}" in formatted:
        return True
    name = identity.display_name
    if name and not isinstance(mentions, dict) and re.search(
            rf"(?<!\w){re.escape(name)}(?!\w)", body, re.IGNORECASE):
        return True
    target = reply_target(content)
    return bool(target and room.is_bot_event(target))


def _place(content: dict[str, Any], room: RoomView, sender: str
           ) -> tuple[str, str | None, str | None]:
    """(chat_type, group_id, thread_id)."""
    rel = relation(content)
    thread = rel.get("event_id") if rel.get("rel_type") == "m.thread" else None
    thread = thread if isinstance(thread, str) else None
    if room.is_dm:
        return "dm", None, thread
    return ("thread" if thread else "group"), room.room_id, thread


def media_of(content: dict[str, Any], event_id: str, fetcher: Callable[[str, str], Any]
             ) -> list[InboundMedia]:
    """The file of a media message (``url`` ``mxc://...``), or [] (an encrypted ``file``
    is not supported: end-to-end encryption is not implemented)."""
    kind = MEDIA_KINDS.get(str(content.get("msgtype")))
    url = content.get("url")
    if kind is None or not isinstance(url, str) or not url.startswith("mxc://"):
        return []
    info = content.get("info") if isinstance(content.get("info"), dict) else {}
    name = str(content.get("filename") or content.get("body") or f"{kind}-{event_id}")
    name = name.replace("/", "_")[:200] or f"{kind}-{event_id}"
    size = info.get("size") if isinstance(info.get("size"), int) else None
    mime = info.get("mimetype") if isinstance(info.get("mimetype"), str) else None
    return [InboundMedia(kind=kind, name=name, size=size, mime=mime,
                         fetch=fetcher(url, name), handle=url)]


def _caption(content: dict[str, Any]) -> str:
    # A media message's body is its file name unless a separate filename is given
    # (then the body is a caption: spec v1.10 "media captions").
    filename = content.get("filename")
    body = str(content.get("body") or "")
    return body if filename and body != filename else ""


def inbound_from_event(event: dict[str, Any], room: RoomView, identity: BotIdentity, *,
                       account_id: str, received_at: float,
                       fetcher: Callable[[str, str], Any]) -> InboundMessage | None:
    """One ``m.room.message`` -> InboundMessage; None for anything else, an edit, or the
    bot's own message. Raises KeyError/TypeError/AttributeError for a malformed event."""
    if event.get("type") != "m.room.message":
        return None
    sender, content = event["sender"], event["content"]
    if sender == identity.user_id or not isinstance(content, dict):
        return None
    if relation(content).get("rel_type") == "m.replace":
        return None
    msgtype = content.get("msgtype")
    media = media_of(content, event["event_id"], fetcher)
    if msgtype not in TEXT_TYPES and not media:
        return None
    text = _strip_reply_fallback(str(content.get("body") or "")) if not media \
        else _caption(content)
    mentioned = mentions_bot(content, identity, room)
    if mentioned:
        text = strip_leading_mention(text, identity)
    if msgtype == "m.emote":
        text = f"* {room.names.get(sender) or sender} {text}"
    chat_type, group_id, thread_id = _place(content, room, sender)
    return InboundMessage(
        channel="matrix", text=text, sender_id=sender, chat_type=chat_type,
        account_id=account_id, peer_id=sender,
        group_id=group_id, thread_id=thread_id, sender_name=room.names.get(sender),
        sender_username=sender, mentions_bot=mentioned,
        message_id=event["event_id"], reply_to=reply_target(content),
        received_at=received_at, is_bot=msgtype == "m.notice", raw=event, media=media)


def event_from_event(event: dict[str, Any], room: RoomView, identity: BotIdentity, *,
                     account_id: str) -> ChannelEvent | None:
    """A reaction, an edit or a redaction by someone else -> ChannelEvent; else None."""
    sender, content = event.get("sender"), event.get("content")
    if sender == identity.user_id or not isinstance(content, dict):
        return None
    who = room.names.get(str(sender)) or str(sender)
    rel = relation(content)
    kind, text = None, ""
    if event.get("type") == "m.reaction" and rel.get("rel_type") == "m.annotation":
        kind = "reaction"
        text = f"{who} reacted {rel.get('key')} to message {rel.get('event_id')}"
    elif event.get("type") == "m.room.message" and rel.get("rel_type") == "m.replace":
        new = content.get("m.new_content")
        body = new.get("body") if isinstance(new, dict) else content.get("body")
        kind, text = "edit", f"{who} edited message {rel.get('event_id')}: {body}"[:500]
    elif event.get("type") == "m.room.redaction":
        kind = "delete"
        text = f"{who} deleted message {event.get('redacts') or content.get('redacts')}"
    if kind is None:
        return None
    chat_type, group_id, thread_id = ("dm", None, None) if room.is_dm else (
        "group", room.room_id, None)
    return ChannelEvent(channel="matrix", kind=kind, text=text, account_id=account_id,
                        chat_type=chat_type,
                        peer_id=str(sender),
                        group_id=group_id, thread_id=thread_id, sender_id=str(sender))
