"""WhatsApp Cloud API webhook payloads -> ``InboundMessage`` / ``ChannelEvent`` / statuses.

A POST carries ``{"object": "whatsapp_business_account", "entry": [{"id": <WABA id>,
"changes": [{"field": "messages", "value": {...}}]}]}``; each ``value`` has ``metadata``
(``phone_number_id``: which of the business's numbers it is for), ``contacts`` (the
senders' profile names), ``messages`` (what users sent) and/or ``statuses`` (what became
of what we sent: sent, delivered, read, failed). Reference:
https://developers.facebook.com/docs/whatsapp/cloud-api/webhooks/components

Messages of other phone numbers (one Meta app, several numbers) are skipped. The Cloud
API delivers one-to-one chats only, so every message is a DM (``peer_id`` = the sender's
``wa_id``).
"""

from __future__ import annotations

import mimetypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from channels.base import ChannelEvent, InboundMessage
from channels.media.model import Fetch, InboundMedia

MEDIA_TYPES = {"image": "image", "video": "video", "audio": "audio", "document": "document",
               "sticker": "sticker"}
FetchFor = Callable[[str, str], Fetch]  # (media id, file name) -> fetch(max_bytes)


@dataclass(slots=True)
class Batch:
    """What one webhook POST held for this phone number, in order of arrival.
    ``opened``: ``(wa_id, epoch s)`` of every user message (the 24-hour window);
    ``skipped``: ``(message id, reason)`` of messages that carry nothing to answer."""

    messages: list[InboundMessage] = field(default_factory=list)
    events: list[tuple[str, ChannelEvent]] = field(default_factory=list)  # (wamid, event)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    opened: list[tuple[str, float]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    other_numbers: int = 0


def parse_payload(body: Any, *, phone_number_id: str, account_id: str, now: float,
                  fetch_for: FetchFor) -> Batch:
    """Normalise one webhook body. Raises ValueError when it is not a
    ``whatsapp_business_account`` notification at all."""
    if not isinstance(body, dict) or body.get("object") != "whatsapp_business_account":
        raise ValueError("not a whatsapp_business_account notification")
    batch = Batch()
    for entry in _dicts(body.get("entry")):
        for change in _dicts(entry.get("changes")):
            value = change.get("value")
            if change.get("field") != "messages" or not isinstance(value, dict):
                continue
            meta = value.get("metadata") if isinstance(value.get("metadata"), dict) else {}
            if str(meta.get("phone_number_id") or "") != phone_number_id:
                batch.other_numbers += 1
                continue
            names = {str(c.get("wa_id")): str((c.get("profile") or {}).get("name") or "")
                     for c in _dicts(value.get("contacts"))}
            for msg in _dicts(value.get("messages")):
                _message(batch, msg, names, account_id, now, fetch_for)
            batch.statuses.extend(_dicts(value.get("statuses")))
    return batch


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _message(batch: Batch, msg: dict[str, Any], names: dict[str, str], account_id: str,
             now: float, fetch_for: FetchFor) -> None:
    sender, mid, kind = str(msg.get("from") or ""), str(msg.get("id") or ""), msg.get("type")
    if not sender or not mid:
        batch.skipped.append((mid, "no sender or id"))
        return
    name = names.get(sender) or None
    if kind == "reaction":
        event = _reaction(msg, sender, name, account_id)
        if event is not None:
            batch.events.append((mid, event))
        return
    batch.opened.append((sender, min(now, _float(msg.get("timestamp")) or now)))
    text, media = _content(msg, kind, mid, fetch_for)
    if not text and not media:
        batch.skipped.append((mid, f"type {kind!r} carries no text or file"))
        return
    context = msg.get("context") if isinstance(msg.get("context"), dict) else {}
    batch.messages.append(InboundMessage(
        channel="whatsapp", text=text, sender_id=sender, chat_type="dm",
        account_id=account_id, peer_id=sender, sender_name=name, mentions_bot=True,
        message_id=mid, reply_to=str(context["id"]) if context.get("id") else None,
        received_at=now, raw=msg, media=media))


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _content(msg: dict[str, Any], kind: Any, mid: str,
             fetch_for: FetchFor) -> tuple[str, list[InboundMedia]]:
    part = msg.get(kind) if isinstance(kind, str) and isinstance(msg.get(kind), dict) else {}
    if kind == "text":
        return str(part.get("body") or ""), []
    if kind in MEDIA_TYPES:
        media_id = str(part.get("id") or "")
        if not media_id:
            return "", []
        mime = str(part.get("mime_type") or "") or None
        name = str(part.get("filename") or "") or _file_name(kind, media_id, mime)
        media_kind = "voice" if kind == "audio" and part.get("voice") else MEDIA_TYPES[kind]
        return str(part.get("caption") or ""), [InboundMedia(
            kind=media_kind, name=name, mime=mime, fetch=fetch_for(media_id, name),
            handle=media_id)]
    if kind == "interactive":  # a press on a reply button or a list row we sent
        reply = part.get("button_reply") or part.get("list_reply") or {}
        return str(reply.get("title") or reply.get("id") or ""), []
    if kind == "button":  # a quick-reply button of a template
        return str(part.get("text") or part.get("payload") or ""), []
    if kind == "location":
        where = ", ".join(str(part[k]) for k in ("name", "address") if part.get(k))
        return (f"[location {part.get('latitude')}, {part.get('longitude')}"
                + (f": {where}" if where else "") + "]"), []
    if kind == "contacts":
        cards = [c for c in msg.get("contacts") or [] if isinstance(c, dict)]
        return "[shared contact: " + "; ".join(_card(c) for c in cards) + "]", []
    return "", []


def _card(card: dict[str, Any]) -> str:
    name = str((card.get("name") or {}).get("formatted_name") or "unnamed")
    phones = [str(p.get("phone")) for p in card.get("phones") or []
              if isinstance(p, dict) and p.get("phone")]
    return name + (f" ({', '.join(phones)})" if phones else "")


def _file_name(kind: str, media_id: str, mime: str | None) -> str:
    base = (mime or "").split(";")[0].strip()
    ext = {"audio/ogg": ".ogg", "image/jpeg": ".jpg", "image/webp": ".webp"}.get(base) \
        or (mimetypes.guess_extension(base) if base else None) or ""
    return f"{kind}-{media_id}{ext}"


def _reaction(msg: dict[str, Any], sender: str, name: str | None,
              account_id: str) -> ChannelEvent | None:
    part = msg.get("reaction") if isinstance(msg.get("reaction"), dict) else {}
    target = part.get("message_id")
    if not target:
        return None
    who = name or sender
    emoji = str(part.get("emoji") or "")
    what = f"added {emoji}" if emoji else "removed their reaction"
    return ChannelEvent(channel="whatsapp", kind="reaction", account_id=account_id,
                        chat_type="dm", peer_id=sender, sender_id=sender,
                        text=f"WhatsApp reaction: {who} {what} on message {target}")
