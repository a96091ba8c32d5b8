"""Discord outbound: pick the target channel, send rendered parts, map errors.

Used by ``channels/discord/adapter.py``; shapes follow issue 3 and the REST docs
(https://discord.com/developers/docs/resources/message#create-message,
https://discord.com/developers/docs/topics/rate-limits).

Error mapping for ``send_chunks`` (channels/outbound/delivery.py):

- ``discord.RateLimited`` (a wait longer than discord.py's ``max_ratelimit_timeout``) and
  a 429 discord.py did not retry -> ``RateLimited(retry_after)`` (send_chunks waits on the
  clock). Shorter 429s are waited out by discord.py itself, honouring ``retry_after``.
- 400 ``50035 Invalid Form Body`` on ``content`` for a formatted part -> ``MarkupRejected``
  (the part is resent as plain text).
- 5xx, 408, network errors, timeouts -> ``DeliveryError(retryable=True)``; other 4xx
  (missing permissions 50013, unknown channel 10003...) -> ``retryable=False``.
- Every part carries a ``nonce`` (discord.py adds ``enforce_nonce``); a part whose outcome
  is unknown (sent, never answered) is resent with the same nonce, which Discord answers
  with the message it already created; still unknown after that, it is unconfirmed.
"""

from __future__ import annotations

import hashlib
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import aiohttp
import discord
import structlog

from channels.base import DeliveryResult, OutboundMessage
from channels.discord.media import send_files
from channels.discord.rest import shielded
from channels.media.outbound import files_failed, upload_problem
from channels.outbound.delivery import DeliveryError, MarkupRejected, RateLimited, send_chunks
from channels.outbound.render import render_chunks
from channels.outbound.send_outcome import outcome_unknown
from runtime.clock import Clock, maybe_timeout

INVALID_FORM_BODY = 50035
# Resends of a part whose outcome is unknown (same nonce: Discord returns the message it
# already created instead of a second one, enforce_nonce); then the part is unconfirmed.
RESEND_DELAYS = (0.5, 1.5)

log = structlog.get_logger(__name__)


def snowflake(value: str | int, what: str = "id") -> int:
    """A Discord id as int; raises DeliveryError(retryable=False) when not numeric."""
    text = str(value).strip()
    if not text.isdigit():
        raise DeliveryError(f"invalid discord {what} {text!r}: expected a numeric snowflake",
                            retryable=False)
    return int(text)


def _retry_after(exc: discord.HTTPException) -> float:
    response = getattr(exc, "response", None)
    header = response.headers.get("Retry-After") if response is not None else None
    try:
        return float(header) if header else 1.0
    except ValueError:
        return 1.0


def map_error(exc: BaseException, formatted: bool = False) -> BaseException:
    """Translate a discord.py / aiohttp failure into the delivery vocabulary."""
    if isinstance(exc, (RateLimited, MarkupRejected, DeliveryError)):
        return exc
    if isinstance(exc, discord.RateLimited):
        return RateLimited(exc.retry_after)
    if isinstance(exc, discord.HTTPException):
        status, code = exc.status, exc.code
        if status == 429:
            return RateLimited(_retry_after(exc))
        text = (exc.text or "").replace("\n", "; ")
        if status == 400 and code == INVALID_FORM_BODY and formatted and "content" in text:
            return MarkupRejected(f"Discord 400 {code}: {text}")
        return DeliveryError(f"Discord HTTP {status} (code {code}): {text}",
                             retryable=status >= 500 or status == 408)
    if isinstance(exc, (TimeoutError, aiohttp.ClientError, OSError, ConnectionError)):
        return DeliveryError(f"network: {type(exc).__name__}: {exc}", retryable=True)
    return exc


async def resolve_target(client: discord.Client, to: str, thread_id: str | None,
                         dm_channels: MutableMapping[str, int], *, clock: Clock,
                         timeout: float | None) -> int:
    """The channel id to post into: ``thread_id`` if set; else ``to`` as a known DM peer,
    a cached channel, or (unknown id) a user to open a DM with (``POST /users/@me/channels``;
    Discord answers 400/404 for a non-user, and ``to`` is then used as a channel id).
    Raises DeliveryError / discord exceptions (mapped by the caller)."""
    if thread_id:
        return snowflake(thread_id, "thread id")
    target = snowflake(to, "chat id")
    if str(target) in dm_channels:
        return dm_channels[str(target)]
    if client.get_channel(target) is not None:
        return target
    try:
        async with maybe_timeout(clock, timeout):
            dm = await shielded(client.create_dm(discord.Object(id=target)))
    except discord.HTTPException as exc:
        if exc.status in (400, 404):
            return target
        raise
    dm_channels[str(target)] = dm.id
    return dm.id


async def send_message(client: discord.Client, message: OutboundMessage, *, clock: Clock,
                       timeout: float | None, dm_channels: MutableMapping[str, int]
                       ) -> DeliveryResult:
    """Render ``message.text`` for Discord (<= 2000 characters a part) and send the parts
    in order to the resolved channel; the first part (every part when ``reply_to_all``)
    replies to ``reply_to``. Returns the
    ``send_chunks`` result (a ChunkDeliveryResult) or a failed DeliveryResult when the
    target cannot be resolved."""
    try:
        target = await resolve_target(client, message.to, message.thread_id, dm_channels,
                                      clock=clock, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - reported as a result, never raised
        mapped = map_error(exc)
        retryable = isinstance(mapped, RateLimited) or bool(
            getattr(mapped, "retryable", False))
        return DeliveryResult(ok=False, error=f"{type(mapped).__name__}: {mapped}",
                              retryable=retryable)
    channel = client.get_partial_messageable(target)
    reference = None
    if message.reply_to and str(message.reply_to).isdigit():
        reference = discord.MessageReference(message_id=int(message.reply_to),
                                             channel_id=target, fail_if_not_exists=False)
    sent: list[int] = []

    async def send_part(text: str, formatted: bool) -> str:
        msg = await send_once(channel, text, nonce=part_nonce(message.idempotency_key, text),
                              reference=reference if message.reply_to_all or not sent
                              else None, formatted=formatted, clock=clock, timeout=timeout)
        sent.append(msg.id)
        return str(msg.id)

    problems = [p for p in (upload_problem("discord", Path(f)) for f in message.media) if p]
    if problems:  # checked before anything is sent: the model gets the reason
        return DeliveryResult(ok=False, retryable=False, error="; ".join(problems))
    result: DeliveryResult = DeliveryResult(ok=True)
    if message.text.strip() or not message.media:
        result = await send_chunks(render_chunks(message.text, "discord"), send_part,
                                   clock=clock)
    if result.ok and message.media:
        try:
            async with maybe_timeout(clock, timeout):
                result.message_ids += await shielded(send_files(channel, message.media))
        except Exception as exc:  # noqa: BLE001 - reported as a result
            mapped = map_error(exc)
            return files_failed(result.message_ids, message.media, error=str(mapped),
                                retryable=bool(getattr(mapped, "retryable", False)))
    return result


async def send_once(channel: Any, text: str, *, nonce: str | None,
                    reference: discord.MessageReference | None, formatted: bool,
                    clock: Clock, timeout: float | None) -> discord.Message:
    """``channel.send`` with ``nonce``; a send whose outcome is unknown is resent with the
    same nonce (Discord answers with the message it already created). Raises the
    ``map_error`` mapping of the last failure."""
    for delay in (*RESEND_DELAYS, None):
        try:
            async with maybe_timeout(clock, timeout):
                return await shielded(channel.send(content=text, nonce=nonce,
                                                   reference=reference))
        except Exception as exc:
            mapped = map_error(exc, formatted)
            if delay is None or nonce is None or not outcome_unknown(exc):
                raise mapped from exc
            # Maybe created, never answered: the same nonce makes the resend safe.
            log.warning("discord_send_resent_with_nonce", nonce=nonce,
                        error=f"{type(exc).__name__}: {exc}")
            await clock.sleep(delay)
    raise AssertionError("unreachable")


def part_nonce(key: str | None, text: str) -> str | None:
    """The ``nonce`` of one part: stable for the same message key and part text (so an
    outbox retry reuses it), at most 25 characters (Discord's limit). None without a
    key."""
    if not key:
        return None
    return hashlib.sha256(f"{key}\0{text}".encode()).hexdigest()[:25]


async def typing_once(client: discord.Client, target: int, *, clock: Clock,
                      timeout: float | None) -> None:
    """One ``POST /channels/{target}/typing``; raises on failure (caller ignores)."""
    async with maybe_timeout(clock, timeout):
        await shielded(client.get_partial_messageable(target).typing())
