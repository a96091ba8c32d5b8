"""The shared send loop adapters use: rate-limit waits, markup fallback, partial results.

Adapters wrap one platform call in a function that raises :class:`RateLimited` on HTTP 429
(Telegram ``RetryAfter``, Slack ``Retry-After``, Discord ``retry_after``) and
:class:`MarkupRejected` when the platform refuses the formatting (Telegram "can't parse
entities", Slack ``invalid_blocks``); ``send_chunks`` then waits (via the clock) or resends
the part as plain text. A part whose outcome is unknown (the request was written, no
answer came: channels/outbound/send_outcome.py) is reported ``unconfirmed`` and never resent. Any
other error stops the send; the result says how many parts went
out and carries the Markdown of the rest so the gateway can queue just that in the outbox
(channels/outbound/outbox.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import structlog

from channels.base import DeliveryResult
from channels.outbound.render import RenderedChunk
from channels.outbound.send_outcome import outcome_unknown
from runtime.clock import Clock

log = structlog.get_logger(__name__)

T = TypeVar("T")


class RateLimited(Exception):
    """The platform said 429: retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: float, message: str = "rate limited") -> None:
        super().__init__(f"{message} (retry after {retry_after:g} s)")
        self.retry_after = float(retry_after)


class MarkupRejected(Exception):
    """The platform rejected the formatted text (resend it as plain text)."""


class DeliveryError(Exception):
    """A send failure with an explicit ``retryable`` verdict (network/5xx: True)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(slots=True)
class ChunkDeliveryResult(DeliveryResult):
    """A DeliveryResult that also says how far a multi-part send got: ``chunks_sent`` parts
    were delivered (their ids in ``message_ids``); ``remaining_text`` is the Markdown of the
    parts not sent (None when everything went out)."""

    chunks_sent: int = 0
    remaining_text: str | None = None
    remaining_media: list[str] | None = None  # files not uploaded (the text went out)


_NOT_RETRYABLE = {"BadRequest", "Forbidden", "InvalidToken", "Conflict", "ChatMigrated",
                  "NotFound", "EndOfStream"}
_RETRYABLE = {"TimedOut", "NetworkError", "ClientConnectionError", "ClientPayloadError",
              "ServerTimeoutError", "ServerDisconnectedError", "DiscordServerError",
              "ConnectionClosed", "ConnectionError", "TimeoutError"}


def _status(exc: BaseException) -> int | None:
    for obj in (exc, getattr(exc, "response", None)):
        for attr in ("status", "status_code"):
            value = getattr(obj, attr, None)
            if isinstance(value, int) and 100 <= value < 600:
                return value
    return None


def is_retryable(exc: BaseException) -> bool:
    """Whether a failed send may succeed later: network errors, timeouts, HTTP 408/429/5xx.

    Order: an explicit ``exc.retryable`` bool; an HTTP status on the exception or its
    ``response`` (discord.py ``status``, slack_sdk ``response.status_code``); known class
    names (python-telegram-bot's BadRequest subclasses NetworkError, so it is checked first);
    finally OSError/TimeoutError count as network trouble."""
    verdict = getattr(exc, "retryable", None)
    if isinstance(verdict, bool):
        return verdict
    status = _status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    names = {c.__name__ for c in type(exc).__mro__}
    if names & _NOT_RETRYABLE:
        return False
    if names & _RETRYABLE:
        return True
    return isinstance(exc, (OSError, TimeoutError, asyncio.TimeoutError))


async def _rate_limited(call: Callable[[], Awaitable[T]], clock: Clock, attempts: int,
                        max_retry_after: float) -> T:
    """``await call()``, waiting out RateLimited up to ``attempts`` calls in all; re-raises
    the last RateLimited (or one asking for more than ``max_retry_after`` seconds)."""
    for attempt in range(1, max(1, attempts) + 1):
        try:
            return await call()
        except RateLimited as e:
            wait = max(0.0, e.retry_after)
            if attempt >= attempts or wait > max_retry_after:
                raise
            log.warning("rate_limited", retry_after=wait, attempt=attempt)
            await clock.sleep(wait)
    raise AssertionError("unreachable")


async def send_with_retry(send_once: Callable[[], Awaitable[DeliveryResult | str | None]], *,
                          clock: Clock, attempts: int = 3, max_retry_after: float = 300
                          ) -> DeliveryResult:
    """Call ``send_once()`` and retry it after the wait a RateLimited asks for.

    ``send_once`` returns a DeliveryResult, a platform message id, or None. Up to
    ``attempts`` calls; a wait longer than ``max_retry_after`` seconds is not attempted.
    Returns DeliveryResult(ok=False, retryable=True) when still rate limited; any other
    exception propagates to the caller.
    """
    try:
        result = await _rate_limited(send_once, clock, attempts, max_retry_after)
    except RateLimited as e:
        return DeliveryResult(ok=False, error=str(e), retryable=True)
    if isinstance(result, DeliveryResult):
        return result
    return DeliveryResult(ok=True, message_ids=[result] if result else [])


async def send_chunks(chunks: list[RenderedChunk],
                      send_part: Callable[[str, bool], Awaitable[str]], *, clock: Clock,
                      attempts: int = 3, max_retry_after: float = 300) -> ChunkDeliveryResult:
    """Send rendered parts in order with ``send_part(text, formatted)`` -> message id.

    Per part: MarkupRejected -> resend ``plain`` with formatted=False, and every later part
    of the message goes plain at once (a reply is never half formatted, half not, and the
    refused markup is not tried again part after part); RateLimited -> wait
    ``retry_after`` (clock) and retry, up to ``attempts`` calls; any other exception -> stop.
    Returns ok=True with every id, or ok=False with the ids sent so far, ``chunks_sent``,
    ``remaining_text`` (Markdown of the unsent parts, from RenderedChunk.source or the plain
    text) and ``retryable`` per :func:`is_retryable` (True when still rate limited).
    """
    ids: list[str] = []
    plain_only = False
    for i, chunk in enumerate(chunks):
        try:
            try:
                if plain_only:
                    raise MarkupRejected("an earlier part's markup was refused")
                mid = await _rate_limited(lambda c=chunk: send_part(c.formatted, True), clock,
                                          attempts, max_retry_after)
            except MarkupRejected as e:
                if not plain_only:
                    log.warning("markup_rejected", part=i, error=str(e))
                plain_only = True
                mid = await _rate_limited(lambda c=chunk: send_part(c.plain, False), clock,
                                          attempts, max_retry_after)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure ends the send, reported
            if outcome_unknown(e):
                return _unconfirmed(chunks, i, ids, e)
            retryable = isinstance(e, RateLimited) or (
                not isinstance(e, MarkupRejected) and is_retryable(e))
            rest = "\n\n".join(c.source or c.plain for c in chunks[i:])
            log.warning("send_failed", part=i, parts=len(chunks), retryable=retryable,
                        error=f"{type(e).__name__}: {e}")
            return ChunkDeliveryResult(ok=False, message_ids=ids,
                                       error=f"{type(e).__name__}: {e}", retryable=retryable,
                                       chunks_sent=i, remaining_text=rest)
        if mid:
            ids.append(str(mid))
    return ChunkDeliveryResult(ok=True, message_ids=ids, chunks_sent=len(chunks))


def _unconfirmed(chunks: list[RenderedChunk], i: int, ids: list[str],
                 e: BaseException) -> ChunkDeliveryResult:
    """Part ``i`` may have arrived (no answer came): it is not sent again; the parts after
    it certainly did not arrive and stay retryable."""
    rest = "\n\n".join(c.source or c.plain for c in chunks[i + 1:]) or None
    log.warning("send_unconfirmed", part=i, parts=len(chunks),
                error=f"{type(e).__name__}: {e}")
    return ChunkDeliveryResult(ok=False, message_ids=ids, error=f"outcome unknown: "
                               f"{type(e).__name__}: {e}", retryable=rest is not None,
                               unconfirmed=True, chunks_sent=i + 1, remaining_text=rest)
