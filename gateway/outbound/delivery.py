"""Outbound delivery: send replies to the right channel account, typing indicators while a
turn runs, and the on-disk outbox for what could not be delivered (DESIGN.md step 8)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import structlog

from channels.base import Channel, DeliveryResult, OutboundMessage
from gateway.routing import Route
from runtime import telemetry
from runtime.clock import SYSTEM_CLOCK, Clock, utc_iso

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
        self.unconfirmed: collections.deque[dict[str, Any]] = collections.deque(maxlen=50)
        self.unconfirmed_total = 0
        # session key -> (target, normalised text) its running turn sent with the message tool
        self.tool_targets: dict[str, set[tuple[tuple[str, str, str | None], str]]] = {}

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
                   media: list[str] | None = None,
                   idempotency_key: str | None = None,
                   reply_to_all: bool = False,
                   answers: str | None = None) -> DeliveryResult:
        """Deliver ``text`` (and ``media``: absolute file paths) to ``route``; ``reply_to``
        quotes the first part (every part with ``reply_to_all``). A send that
        certainly did not arrive and may succeed later goes to the outbox; one whose
        outcome is unknown is recorded as unconfirmed (never resent); an unknown channel
        is logged as an error. ``idempotency_key`` (default: a new one) stays with the
        message through outbox retries (Discord nonces). ``answers``: the inbound message id
        a command's notice answers (channels/inbound/command_replies.py). Never raises for
        platform errors."""
        msg = OutboundMessage(channel=route.channel, to=route.to, text=text,
                              account_id=route.account, thread_id=route.thread,
                              reply_to=reply_to, kind=kind, session_key=session_key,
                              run_id=run_id, media=list(media or ()),
                              idempotency_key=idempotency_key or uuid.uuid4().hex,
                              reply_to_all=reply_to_all, answers=answers)
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
            with telemetry.span("platform.send", {"tidegate.channel": msg.channel,
                                                  "tidegate.send.kind": msg.kind}) as sp:
                result = await ch.send(msg)
                sp.set_attributes({"tidegate.send.ok": result.ok,
                                   "tidegate.send.parts": len(result.message_ids or ())})
                telemetry.content(sp, {"tidegate.send.text": msg.text})
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
        if result.unconfirmed:  # one part may have arrived: never sent again
            self.record_unconfirmed(msg.channel, msg.to, session_key=msg.session_key,
                                    reason=result.error or "no answer", run_id=msg.run_id)
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
        elif not result.unconfirmed and (queue_on_failure or not result.retryable):
            log.error("delivery_failed", channel=msg.channel, to=msg.to, error=result.error,
                      session_key=msg.session_key)
        return result

    def note_streamed(self, route: Route, *, parts: int, session_key: str | None,
                      run_id: str | None) -> None:
        """A streamed reply (gateway/outbound/replies.py) reached its final form: counted and logged
        like any delivery."""
        self.sent += 1
        log.info("delivered", channel=route.channel, to=route.to, kind="reply", parts=parts,
                 session_key=session_key, run_id=run_id, streamed=True)

    def note_tool_send(self, session_key: str, route: Route, text: str) -> None:
        """The turn running for ``session_key`` sent ``text`` to ``route`` with the
        message tool."""
        self.tool_targets.setdefault(session_key, set()).add((_target(route),
                                                              _normal(text)))

    def tool_sent_to(self, session_key: str, route: Route) -> bool:
        """Whether the turn running for ``session_key`` has sent anything to ``route``
        with the message tool so far (its sends are kept for :meth:`reached_by_tool`)."""
        target = _target(route)
        return any(t == target for t, _ in self.tool_targets.get(session_key, ()))

    def reached_by_tool(self, session_key: str, route: Route, text: str, *,
                        any_text: bool = False) -> bool:
        """Whether the turn of ``session_key`` already delivered ``text`` (the same words,
        or a text containing them; with ``any_text``, any text at all: a chat turn that
        messaged its own chat has answered there) to ``route`` with the message tool; its
        final text is then not delivered there again (docs/outcomes.md). Forgets the
        turn's sends."""
        target, final = _target(route), _normal(text)
        reached = any(t == target and (any_text or final in sent)
                      for t, sent in self.tool_targets.pop(session_key, set()))
        if reached:
            log.info("reply_suppressed", session_key=session_key, channel=route.channel,
                     to=route.to, reason="the turn already sent to this target with the "
                                         "message tool; its final text stays in the "
                                         "transcript")
        return reached

    async def resend_unknown(self, route: Route, text: str, *, since: float,
                             session_key: str | None, idempotency_key: str,
                             reply_to: str | None = None) -> str:
        """Deliver ``text`` whose earlier send (begun at ``since``, epoch s) may have
        arrived, without doubling it: through the adapter's ``resend_unknown(message,
        since)`` (Discord: same nonces; Slack: look up first) when it has one, else
        recorded as unconfirmed; what certainly did not arrive goes to the outbox.
        Returns ``delivered`` | ``unconfirmed`` | ``queued`` | ``failed``."""
        ch = self.find(route.channel, route.account)
        resend = getattr(ch, "resend_unknown", None)
        if resend is None:
            self.record_unconfirmed(route.channel, route.to, session_key=session_key,
                                    reason="a crash interrupted the send; the platform "
                                           "cannot be asked whether it arrived")
            return "unconfirmed"
        msg = OutboundMessage(channel=route.channel, to=route.to, text=text,
                              account_id=route.account, thread_id=route.thread,
                              reply_to=reply_to, session_key=session_key,
                              idempotency_key=idempotency_key)
        try:
            result = await resend(msg, since)
        except Exception as exc:  # noqa: BLE001 - reported like a failed send
            result = DeliveryResult(ok=False, error=str(exc))
        if result.ok:
            self.sent += 1
            return "delivered"
        if result.unconfirmed:
            self.record_unconfirmed(route.channel, route.to, session_key=session_key,
                                    reason=result.error or "no answer")
            return "unconfirmed"
        self.failed += 1
        if result.retryable and self.outbox is not None:  # certainly not there (yet)
            self.outbox.put(msg, result.error or "send failed")
            return "queued"
        log.error("delivery_failed", channel=route.channel, to=route.to,
                  error=result.error, session_key=session_key)
        return "failed"

    def record_unconfirmed(self, channel: str, to: str, *, session_key: str | None,
                           reason: str, run_id: str | None = None) -> None:
        """A send whose outcome is unknown and that is not sent again (README "Delivery
        guarantees"): logged, counted and listed (last 50) in ``tidegate status``."""
        self.unconfirmed_total += 1
        self.unconfirmed.append({"at": utc_iso(self.clock.time()), "channel": channel,
                                 "to": to, "session_key": session_key, "reason": reason})
        log.warning("delivery_unconfirmed", channel=channel, to=to, session_key=session_key,
                    run_id=run_id, reason=reason)

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


def _target(route: Route) -> tuple[str, str, str | None]:
    return route.channel.strip().lower(), str(route.to).strip().lower(), route.thread or None


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()
