"""Matrix sends: room events through matrix-nio's ``room_send`` (``PUT /rooms/{room}/send/
{type}/{txn}``), with errors mapped to the shared send loop's exceptions.

Every part of a reply is an ``m.text`` event carrying the Markdown rendered to HTML
(``format: org.matrix.custom.html``) and a plain ``body``. Its transaction id is
``<idempotency_key>.<part>`` (``.f<n>`` for files): the homeserver answers a repeated
transaction id with the first event instead of a second one, so a part whose outcome was
unknown (the request went out, no answer came) is sent again safely, once, and an outbox
retry of the same reply cannot double what arrived. Threads: ``m.relates_to`` with
``rel_type: m.thread`` (``m.in_reply_to`` the triggering event, else the thread fallback);
outside threads the first part (every part with ``reply_to_mode: all``) replies to it.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from channels.base import DeliveryResult, OutboundMessage
from channels.matrix.media import upload_file
from channels.media.outbound import files_failed, upload_problem
from channels.outbound.delivery import (
    ChunkDeliveryResult,
    DeliveryError,
    RateLimited,
    is_retryable,
    send_chunks,
)
from channels.outbound.render import render_chunks
from channels.outbound.send_outcome import outcome_unknown
from runtime.clock import Clock

HTML = "org.matrix.custom.html"


def relates_to(message: OutboundMessage, index: int) -> dict[str, Any] | None:
    """The ``m.relates_to`` of part ``index`` of ``message`` (None: a plain message)."""
    reply = message.reply_to if (index == 0 or message.reply_to_all) else None
    if message.thread_id:
        rel: dict[str, Any] = {"rel_type": "m.thread", "event_id": message.thread_id,
                               "is_falling_back": reply is None,
                               "m.in_reply_to": {"event_id": reply or message.thread_id}}
        return rel
    return {"m.in_reply_to": {"event_id": reply}} if reply else None


def text_content(body: str, html: str | None) -> dict[str, Any]:
    content: dict[str, Any] = {"msgtype": "m.text", "body": body}
    if html is not None:
        content.update({"format": HTML, "formatted_body": html})
    return content


async def put_event(client: Any, room_id: str, event_type: str, content: dict[str, Any],
                    txn_id: str | None = None) -> str:
    """Send one event; returns its event id. Raises RateLimited (429), DeliveryError
    (refused; retryable for 5xx), or the transport's exception. A request that went out
    unanswered is repeated once with the same transaction id (the homeserver dedupes it)."""
    from nio import RoomSendResponse

    txn = txn_id or uuid.uuid4().hex
    try:
        resp = await client.room_send(room_id, event_type, content, tx_id=txn)
    except Exception as exc:
        if not outcome_unknown(exc):
            raise
        resp = await client.room_send(room_id, event_type, content, tx_id=txn)
    if isinstance(resp, RoomSendResponse):
        return resp.event_id
    raise refusal(resp)


def refusal(resp: Any) -> Exception:
    """The exception for an nio error response: RateLimited for ``M_LIMIT_EXCEEDED`` /
    429, else DeliveryError (retryable for a 5xx)."""
    status = getattr(getattr(resp, "transport_response", None), "status", None)
    code = getattr(resp, "status_code", None)
    if code == "M_LIMIT_EXCEEDED" or status == 429:
        return RateLimited((getattr(resp, "retry_after_ms", None) or 1000) / 1000)
    return DeliveryError(f"matrix refused: {code or status}: {getattr(resp, 'message', '')}",
                         retryable=bool(status and status >= 500))


async def send_outbound(client: Any, room_id: str, message: OutboundMessage, *,
                        clock: Clock) -> DeliveryResult:
    """Render ``message.text`` for Matrix, send its parts in order, then its files
    (checked against the size limit first). Partial failures report what is left for
    the outbox (``remaining_text`` / ``remaining_media``)."""
    for name in message.media:
        problem = upload_problem("matrix", Path(name))
        if problem:
            return DeliveryResult(ok=False, error=problem, retryable=False)
    key = message.idempotency_key or uuid.uuid4().hex
    chunks = render_chunks(message.text, "matrix") if message.text.strip() else []
    plain_of = {c.formatted: c.plain for c in chunks}
    sent = {"parts": 0}

    async def send_part(text: str, formatted: bool) -> str:
        index = sent["parts"]
        content = text_content(plain_of.get(text, text) if formatted else text,
                               text if formatted else None)
        rel = relates_to(message, index)
        if rel:
            content["m.relates_to"] = rel
        event_id = await put_event(client, room_id, "m.room.message", content,
                                   f"{key}.{index}")
        sent["parts"] += 1
        return event_id

    result = await send_chunks(chunks, send_part, clock=clock)
    if not result.ok or not message.media:
        return result
    return await _send_files(client, room_id, message, key, list(result.message_ids))


async def _send_files(client: Any, room_id: str, message: OutboundMessage, key: str,
                      ids: list[str]) -> DeliveryResult:
    for n, name in enumerate(message.media):
        try:
            content = await upload_file(client, Path(name))
            if message.thread_id:
                content["m.relates_to"] = relates_to(message, 1)
            ids.append(await put_event(client, room_id, "m.room.message", content,
                                       f"{key}.f{n}"))
        except Exception as exc:  # noqa: BLE001 - the rest of the files go to the outbox
            retryable = isinstance(exc, RateLimited) or is_retryable(exc)
            return files_failed(ids, message.media[n:], f"{type(exc).__name__}: {exc}",
                                retryable)
    return ChunkDeliveryResult(ok=True, message_ids=ids, chunks_sent=len(ids))
