"""Inbound half of the Telegram adapter (``TelegramChannel`` in
channels/telegram/adapter.py): one raw Bot API update -> ``InboundMessage`` /
``ChannelEvent`` (channels/telegram/normalize.py) handed to the gateway's callbacks.

The adapter's attributes used here (``_identity``, ``_on_message``, ``_on_event``,
``_bot``, ``_clock``, ``_log``, ``account_id``, ``_redact``) are set by
``TelegramChannel.__init__``/``start``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from telegram import Update

from channels.telegram.buttons import dispatch_press
from channels.telegram.normalize import event_from_update, inbound_from_update


async def dispatch_update(channel: Any, raw: Any) -> None:
    """Normalise one raw update (JSON dict) and hand it to the gateway callbacks.

    Malformed updates and callback errors are logged and swallowed: one bad update
    never stops the adapter. Used by the poll loop and the webhook route.
    """
    identity = channel._identity
    if identity is None or channel._on_message is None or channel._on_event is None:
        channel._log.warning("telegram_update_dropped", reason="adapter not started")
        return
    uid = raw.get("update_id") if isinstance(raw, dict) else None
    if isinstance(raw, dict) and isinstance(raw.get("callback_query"), dict):
        try:  # a button press (an approval): not a message
            await dispatch_press(channel, raw)
        except Exception as exc:  # noqa: BLE001 - one bad press never stops the adapter
            channel._log.warning("telegram_press_failed", update_id=uid,
                                 error=f"{type(exc).__name__}: {channel._redact(exc)}")
        return
    try:
        if not isinstance(raw, dict):
            raise TypeError(f"update is {type(raw).__name__}, not an object")
        update = Update.de_json(raw, channel._bot)
        inbound = inbound_from_update(update, identity, account_id=channel.account_id,
                                      received_at=channel._clock.time(), raw=raw,
                                      bot_api=channel._bot)
        event = None if inbound else event_from_update(update, identity,
                                                       account_id=channel.account_id)
    except Exception as exc:  # noqa: BLE001 - skip the update, keep the adapter
        channel._log.warning("telegram_update_malformed", update_id=uid,
                             error=f"{type(exc).__name__}: {channel._redact(exc)}")
        return
    if inbound is not None:
        # a media group arrives as one update per file: each is handed over (and
        # journaled) at once; the gateway merges them into one turn (gateway/inbound/albums.py)
        inbound.album_id = _media_group(raw)
    try:
        if inbound is not None:
            await channel._on_message(inbound)
        elif event is not None:
            await channel._on_event(event)
        else:
            channel._log.debug("telegram_update_ignored", update_id=uid,
                           kinds=[k for k in raw if k != "update_id"])
    except Exception:  # noqa: BLE001 - a gateway bug must not stop polling
        channel._log.exception("telegram_handler_failed", update_id=uid)


def _media_group(raw: Any) -> str | None:
    message = (raw.get("message") or raw.get("channel_post")) if isinstance(raw, dict) else None
    group = message.get("media_group_id") if isinstance(message, dict) else None
    return str(group) if group else None


async def dispatch_batch(channel: Any, result: list[Any]) -> None:
    """Hand over one ``getUpdates`` batch in order, advancing ``channel._offset`` past
    each update once handed over, then save the offset (``offset_store``: replicas).
    The poll loop runs it as a task of its own (``channel._batch``) that a ``stop()``
    waits for instead of cancelling it: an update cut off mid-way — journaled but not
    yet queued on its lane — would be lost, its redelivery refused as a duplicate."""
    for raw in result:
        await channel.dispatch(raw)
        # confirmed only once handed over: a stop() mid-dispatch gets it redelivered
        uid = raw.get("update_id") if isinstance(raw, dict) else None
        if isinstance(uid, int) and not isinstance(uid, bool):
            channel._offset = max(channel._offset or 0, uid + 1)
    if result and channel.offset_store is not None:
        await channel.offset_store.save(channel._offset)


async def finish_batch(channel: Any, wait: float) -> None:
    """``stop()``: let the batch being handed over finish (at most ``wait`` seconds,
    then it is cancelled: a PostgreSQL outage must not hold a shutdown forever)."""
    batch, channel._batch = channel._batch, None
    if batch is None or batch.done():
        return
    done, _ = await asyncio.wait({batch}, timeout=wait)
    if not done:
        channel._log.warning("telegram_batch_cut", waited_s=wait,
                             hint="its updates come again and are deduplicated")
        batch.cancel()
    await asyncio.gather(batch, return_exceptions=True)
