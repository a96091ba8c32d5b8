"""Outbound WhatsApp: one ``OutboundMessage`` -> Graph API ``/messages`` calls.

Text goes out in parts of at most 4096 characters (the Cloud API's ``text.body`` limit)
in WhatsApp's own formatting (``*bold*``, ``_italic_``, ``~strike~``, ```` ``` ````
blocks), the first part quoting ``reply_to`` (``context.message_id``). Files are uploaded
(``POST /{phone-number-id}/media``) and sent by media id as ``image`` (JPEG/PNG), ``audio``
(Ogg voice notes) or ``document``.

The 24-hour rule (channels/whatsapp/window.py): a message to a user whose window is closed
— known locally, or answered by Meta with error 131047 — is replaced by the configured
``window_template`` (once until the user writes again) or refused. Either way the reply
itself is reported as not delivered (``ok=False``, not retryable) with the reason, so the
message's outcome says what happened; nothing is dropped silently.

Errors: 5xx, Graph's transient codes and rate limits are retryable (the outbox sends the
rest again); a request written but never answered is ``unconfirmed`` (never resent); any
other Graph error is final.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from channels.base import DeliveryResult, OutboundMessage
from channels.media.outbound import files_failed, upload_kind, upload_problem
from channels.outbound.delivery import ChunkDeliveryResult, RateLimited, send_chunks
from channels.outbound.render import render_chunks
from channels.outbound.send_outcome import outcome_unknown
from channels.whatsapp.graph import GraphClient, GraphError
from channels.whatsapp.window import CustomerWindows
from runtime.clock import Clock, utc_iso

_NOT_DIGITS = re.compile(r"[\s()+.-]")
RATE_LIMIT_WAIT = 6.0  # seconds: the Graph API gives no Retry-After
_WA_TYPES = {"photo": "image", "voice": "audio"}


async def send_outbound(graph: GraphClient, message: OutboundMessage, *,
                        windows: CustomerWindows, template: Any, clock: Clock,
                        log: Any, unreachable: Callable[[str], None] = lambda why: None
                        ) -> DeliveryResult:
    """Send ``message`` to the WhatsApp user ``message.to`` (their ``wa_id``); see the
    module docstring. ``template``: the account's ``window_template`` or None;
    ``unreachable(error)`` is called when the Graph API answered 5xx or could not be
    reached (the adapter then probes it until it is back)."""
    problems = [p for p in (upload_problem("whatsapp", Path(f)) for f in message.media) if p]
    if problems:  # checked before anything is sent: the model gets the reason
        return DeliveryResult(ok=False, retryable=False, error="; ".join(problems))
    to = wa_id(message.to)
    if not windows.is_open(to):
        return await outside_window(graph, to, [], windows=windows, template=template,
                                    log=log)
    part = _PartSender(graph, to, message.reply_to, reply_to_all=message.reply_to_all,
                       unreachable=unreachable)
    result: DeliveryResult = ChunkDeliveryResult(ok=True)
    if message.text.strip():
        result = await send_chunks(render_chunks(message.text, "whatsapp"), part,
                                   clock=clock)
    if result.ok and message.media:
        result = await _send_files(graph, to, message.media, result, part)
    if part.window_closed:
        windows.closed(to)
        return await outside_window(graph, to, list(result.message_ids), windows=windows,
                                    template=template, log=log)
    if not result.ok:
        log.warning("whatsapp_send_failed", to=to, error=result.error,
                    retryable=result.retryable, parts_sent=len(result.message_ids))
    return result


def wa_id(to: str) -> str:
    """A recipient as WhatsApp ids are written (``+49 151 2345-678`` -> ``491512345678``),
    so a configured target finds the same 24-hour window as the user's own messages."""
    return _NOT_DIGITS.sub("", to) or to


class _PartSender:
    """``await part(text, formatted) -> wamid`` for ``send_chunks``. Raises RateLimited
    for Graph rate limits, GraphError else; a 131047 answer sets ``window_closed``."""

    def __init__(self, graph: GraphClient, to: str, reply_to: str | None, *,
                 reply_to_all: bool, unreachable: Callable[[str], None]) -> None:
        self.graph, self.to, self.reply_to, self.reply_to_all = graph, to, reply_to, reply_to_all
        self.unreachable = unreachable
        self.sent_any = False
        self.window_closed = False

    async def call(self, payload: dict[str, Any]) -> str:
        try:
            return await self.graph.send({"to": self.to, **payload})
        except GraphError as exc:
            if exc.outside_window:
                self.window_closed = True
            elif exc.rate_limited:
                raise RateLimited(RATE_LIMIT_WAIT, str(exc)) from exc
            elif exc.status >= 500:
                self.unreachable(str(exc))
            raise
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            self.unreachable(f"{type(exc).__name__}: {exc}")
            raise

    async def __call__(self, text: str, formatted: bool) -> str:
        payload: dict[str, Any] = {"type": "text", "text": {"body": text,
                                                            "preview_url": False}}
        if self.reply_to and (self.reply_to_all or not self.sent_any):
            payload["context"] = {"message_id": self.reply_to}
        wamid = await self.call(payload)
        self.sent_any = True
        return wamid


async def _send_files(graph: GraphClient, to: str, files: list[str], result: DeliveryResult,
                      part: _PartSender) -> DeliveryResult:
    """Upload and send each file; the first failure stops the rest (retryable for 5xx and
    network errors; unconfirmed when the send was written and never answered)."""
    for i, name in enumerate(files):
        path = Path(name)
        kind, mime = upload_kind(path)
        wa_type = _WA_TYPES.get(kind, "document")
        try:
            media_id = await graph.upload(path, mime)
        except Exception as exc:  # noqa: BLE001 - an upload sent nothing to the user
            if not isinstance(exc, GraphError) or exc.status >= 500:
                part.unreachable(f"upload: {type(exc).__name__}: {exc}")
            # an upload only stores the file at Meta: repeating it cannot double anything
            return files_failed(result.message_ids, files[i:], f"upload {path.name}: {exc}",
                                retryable=exc.retryable if isinstance(exc, GraphError)
                                else True)
        body: dict[str, Any] = {"id": media_id}
        if wa_type == "document":
            body["filename"] = path.name
        try:
            wamid = await part.call({"type": wa_type, wa_type: body})
        except Exception as exc:  # noqa: BLE001 - reported in the result
            if part.window_closed:
                return result
            failed = files_failed(result.message_ids, files[i + 1:] if outcome_unknown(exc)
                                  else files[i:], f"{wa_type} {path.name}: {exc}",
                                  retryable=_retryable(exc))
            failed.unconfirmed = outcome_unknown(exc)
            failed.retryable = failed.retryable and bool(failed.remaining_media)
            return failed
        result.message_ids.append(wamid)
    return result


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, GraphError | RateLimited):
        return isinstance(exc, RateLimited) or exc.retryable
    return not outcome_unknown(exc)  # a connection never made: certainly not sent


async def outside_window(graph: GraphClient, to: str, sent: list[str], *,
                         windows: CustomerWindows, template: Any, log: Any) -> DeliveryResult:
    """The reply cannot go out as written: send ``template`` (at most once until the user
    writes again) or refuse. Returns ok=False (the reply itself was not delivered) with
    the reason; retryable only when sending the template failed for a passing cause."""
    last = windows.last_message(to)
    since = f"their last message was at {utc_iso(last)}" if last else \
        "they have not written to this number"
    reason = f"outside WhatsApp's 24-hour customer service window for {to} ({since})"
    if template is None:
        log.warning("whatsapp_window_refused", to=to, reason=reason, parts_sent=len(sent))
        return DeliveryResult(ok=False, message_ids=sent, retryable=False, error=(
            f"refused: {reason}; set window_template to send a template instead"))
    if windows.template_sent(to):
        log.warning("whatsapp_window_refused", to=to, reason=reason, template=template.name,
                    detail="the template was already sent; waiting for the user")
        return DeliveryResult(ok=False, message_ids=sent, retryable=False, error=(
            f"refused: {reason}; template {template.name!r} already sent, waiting for "
            "the user to write back"))
    payload = {"to": to, "type": "template", "template": {
        "name": template.name, "language": {"code": template.language},
        **({"components": template.components} if template.components else {})}}
    try:
        wamid = await graph.send(payload)
    except Exception as exc:  # noqa: BLE001 - reported in the result
        log.warning("whatsapp_template_failed", to=to, template=template.name,
                    error=str(exc))
        return DeliveryResult(ok=False, message_ids=sent,
                              retryable=_retryable(exc) and not sent,
                              error=f"{reason}; template {template.name!r} failed: {exc}")
    windows.note_template(to)
    log.warning("whatsapp_window_template", to=to, template=template.name, reason=reason,
                message_id=wamid)
    return DeliveryResult(ok=False, message_ids=[*sent, wamid], retryable=False, error=(
        f"not delivered: {reason}; template {template.name!r} sent instead"))
