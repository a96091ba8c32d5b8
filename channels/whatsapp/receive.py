"""Inbound half of the WhatsApp adapter: one verified webhook body -> the gateway.

Messages go to ``on_message`` one by one (awaited: journaled before the webhook is
answered); reactions become ``reaction`` ChannelEvents; status callbacks (``sent``,
``delivered``, ``read``, ``failed``) are logged, a ``failed`` one with Meta's error code
and counted in the adapter's status. A ``failed`` status with 131047 (the 24-hour window
had closed) closes the window locally and sends the window template if one is
configured. Meta redelivers notifications it thinks were missed: messages are
deduplicated by the gateway (their ``wamid``), reactions and statuses here (an in-memory
set of recent ids).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from channels.whatsapp.graph import REENGAGEMENT
from channels.whatsapp.normalize import parse_payload

RECENT = 10_000  # reaction/status ids remembered against redelivery


class Recent:
    """A bounded set of recently seen ids (oldest forgotten first)."""

    def __init__(self, size: int = RECENT) -> None:
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict()

    def first_time(self, key: str) -> bool:
        if key in self._ids:
            return False
        self._ids[key] = None
        if len(self._ids) > self.size:
            self._ids.popitem(last=False)
        return True


async def dispatch(channel: Any, payload: Any) -> list[str]:
    """Hand one webhook body to the gateway; returns the outcome of each message.
    Raises ValueError for a body that is not a WhatsApp notification."""
    batch = parse_payload(payload, phone_number_id=channel.config.phone_number_id,
                          account_id=channel.account_id, now=channel._clock.time(),
                          fetch_for=channel.media_fetch)
    if batch.other_numbers:
        channel._log.debug("whatsapp_other_number", changes=batch.other_numbers)
    for mid, reason in batch.skipped:
        channel._log.info("whatsapp_message_skipped", message_id=mid, reason=reason)
    outcomes = await _messages(channel, batch)
    for mid, event in batch.events:
        if channel.seen.first_time(f"event:{mid}"):
            try:
                await channel._on_event(event)
            except Exception:  # noqa: BLE001 - a gateway bug must not fail the webhook
                channel._log.exception("whatsapp_event_failed", message_id=mid)
    for status in batch.statuses:
        await _status(channel, status)
    return outcomes


async def _messages(channel: Any, batch: Any) -> list[str]:
    """Each message to ``on_message``; the 24-hour windows are recorded for senders the
    access policy did not refuse (``denied``) and for users already known — a refused
    stranger leaves nothing in the window document or the adapter's memory. A window is
    open (in memory) while its message is handled, so a pairing reply can go out."""
    windows, opened = channel.windows, {}
    for wa_id, at in batch.opened:
        opened[wa_id] = max(at, opened.get(wa_id, 0.0))
    keep = {w for w in opened if windows.last_message(w) is not None}
    outcomes: list[str] = []
    for msg in batch.messages:
        wa_id = msg.peer_id
        before = windows.last_message(wa_id)
        if wa_id in opened:
            windows.opened(wa_id, opened[wa_id], save=False)
        noted = channel.note_inbound(msg.peer_id, msg.message_id or "")
        outcome = str(await channel._on_message(msg) or "queued")
        outcomes.append(outcome)
        if outcome == "denied":
            windows.restore(wa_id, before)
            channel.forget_inbound(wa_id, noted)
        else:
            keep.add(wa_id)
            channel.mark_read_later(msg.message_id or "")
    changed = [windows.opened(w, at, save=False) for w, at in opened.items() if w in keep]
    if any(changed) or any(o != "denied" for o in outcomes):
        windows.save()
    return outcomes


async def _status(channel: Any, status: dict[str, Any]) -> None:
    mid, state = str(status.get("id") or ""), str(status.get("status") or "")
    if not channel.seen.first_time(f"status:{mid}:{state}"):
        return
    to = str(status.get("recipient_id") or "")
    if state != "failed":
        channel._log.info("whatsapp_status", message_id=mid, status=state, to=to)
        return
    errors = [e for e in status.get("errors") or [] if isinstance(e, dict)]
    first = errors[0] if errors else {}
    code = first.get("code")
    details = (first.get("error_data") or {}).get("details") \
        if isinstance(first.get("error_data"), dict) else None
    error = f"code {code}: {first.get('title') or first.get('message') or 'failed'}" + (
        f" ({details})" if details else "")
    channel.note_failed_delivery(mid, to, error)
    channel._log.warning("whatsapp_message_failed", message_id=mid, to=to, code=code,
                         error=error)
    if code == REENGAGEMENT and to:
        channel.windows.closed(to)
        # in the background: the webhook is answered at once, whatever the Graph API does
        channel._spawn(channel.window_closed_after_send(to))
