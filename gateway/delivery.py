"""Outbound delivery: send replies to the right channel account, typing indicators while a
turn runs, and the on-disk outbox for what could not be delivered (DESIGN.md step 8)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import structlog

from channels.base import Channel, DeliveryResult, OutboundMessage
from gateway.routing import Route
from runtime.clock import SYSTEM_CLOCK, Clock

log = structlog.get_logger(__name__)


class Deliverer:
    """Routes outbound messages to running channels. ``outbox`` (optional) keeps what failed
    for later retry; it must offer ``put(message, error)``."""

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK, typing_interval: float = 4.0,
                 outbox: Any | None = None) -> None:
        self.clock = clock
        self.typing_interval = typing_interval
        self.outbox = outbox
        self.channels: dict[tuple[str, str], Channel] = {}
        self.sent = 0
        self.failed = 0

    def register(self, channel: Channel) -> None:
        self.channels[(channel.name, channel.account_id)] = channel

    def unregister(self, channel: Channel) -> None:
        self.channels.pop((channel.name, channel.account_id), None)

    def find(self, name: str, account: str = "default") -> Channel | None:
        ch = self.channels.get((name, account))
        if ch is None and account == "default":
            # A single-account platform configured under accounts.<id>.
            matches = [c for (n, _), c in self.channels.items() if n == name]
            ch = matches[0] if len(matches) == 1 else None
        return ch

    async def send(self, route: Route, text: str, *, kind: str = "reply",
                   session_key: str | None = None, run_id: str | None = None,
                   reply_to: str | None = None,
                   media: list[str] | None = None) -> DeliveryResult:
        """Deliver ``text`` (and ``media``: absolute file paths) to ``route``. A failed,
        retryable send goes to the outbox; an unknown channel is logged as an error. Never
        raises for platform errors."""
        msg = OutboundMessage(channel=route.channel, to=route.to, text=text,
                              account_id=route.account, thread_id=route.thread,
                              reply_to=reply_to, kind=kind, session_key=session_key,
                              run_id=run_id, media=list(media or ()))
        return await self.send_message(msg)

    async def send_message(self, msg: OutboundMessage, *,
                           queue_on_failure: bool = True) -> DeliveryResult:
        """Send ``msg``; a retryable failure goes to the outbox when ``queue_on_failure``
        (the outbox's own retries pass False: it keeps and reschedules the entry)."""
        ch = self.find(msg.channel, msg.account_id)
        if ch is None:
            self.failed += 1
            log.error("delivery_no_channel", channel=msg.channel, account=msg.account_id,
                      session_key=msg.session_key)
            return DeliveryResult(ok=False, error=f"channel {msg.channel!r} is not running")
        try:
            result = await ch.send(msg)
        except asyncio.CancelledError:
            # Shutdown while sending (e.g. waiting out a long 429): keep it for later.
            if queue_on_failure and self.outbox is not None:
                self.outbox.put(msg, "interrupted by shutdown")
            raise
        except Exception as exc:
            log.exception("delivery_failed", channel=msg.channel, session_key=msg.session_key)
            result = DeliveryResult(ok=False, error=str(exc), retryable=True)
        if result.ok:
            self.sent += 1
            log.info("delivered", channel=msg.channel, to=msg.to, kind=msg.kind,
                     parts=len(result.message_ids), session_key=msg.session_key,
                     run_id=msg.run_id)
            return result
        self.failed += 1
        if result.retryable and self.outbox is not None and queue_on_failure:
            remaining = msg
            sent_parts = getattr(result, "chunks_sent", 0)
            if sent_parts and getattr(result, "remaining_text", None):
                remaining = OutboundMessage(**{**_fields(msg), "text": result.remaining_text})
            elif getattr(result, "remaining_media", None):  # only the files are left
                remaining = OutboundMessage(**{**_fields(msg), "text": "",
                                               "media": result.remaining_media})
            self.outbox.put(remaining, result.error or "send failed")
            log.warning("delivery_queued_in_outbox", channel=msg.channel, to=msg.to,
                        error=result.error, session_key=msg.session_key)
        elif queue_on_failure or not result.retryable:
            log.error("delivery_failed", channel=msg.channel, to=msg.to, error=result.error,
                      session_key=msg.session_key)
        return result

    async def retry_from_outbox(self, msg: OutboundMessage) -> DeliveryResult:
        """The outbox's send function: one attempt, never re-queued (the outbox keeps the
        entry and reschedules it itself)."""
        return await self.send_message(msg, queue_on_failure=False)

    @contextlib.asynccontextmanager
    async def typing(self, route: Route | None) -> AsyncIterator[None]:
        """Show a typing indicator on ``route`` (refreshed) for the duration of the block."""
        ch = self.find(route.channel, route.account) if route else None
        if ch is None or route is None:
            yield
            return

        async def refresh() -> None:
            while True:
                try:
                    await ch.typing(route.to, route.thread)
                except Exception:  # noqa: BLE001 - typing is cosmetic
                    log.debug("typing_failed", channel=route.channel)
                await self.clock.sleep(self.typing_interval)

        task = asyncio.get_running_loop().create_task(refresh())
        try:
            yield
        finally:
            task.cancel()

    def status(self) -> dict[str, Any]:
        return {f"{n}:{a}" if a != "default" else n: ch.status()
                for (n, a), ch in self.channels.items()}


def _fields(msg: OutboundMessage) -> dict[str, Any]:
    return {f: getattr(msg, f) for f in msg.__slots__}  # type: ignore[attr-defined]
