"""Native command invocations waiting for their answer (issue 13 "Commands, natively
registered": "each answered ephemerally where the platform allows").

A Discord application command or a Slack slash command reaches the gateway as an ordinary
``InboundMessage`` whose text is ``/name args``; the gateway answers it with a ``notice``
to the conversation, like a typed command. The adapter registers the invocation here first;
its ``send`` then hands the notice that answers it (``OutboundMessage.answers`` is the
invocation's inbound ``message_id``; ``to``/``thread_id`` as the gateway's route names the
conversation) to the invocation's own reply path — Discord's interaction webhook, Slack's
``response_url`` — which only the invoking user sees. Any other notice to that
conversation (a restart notice, another command's answer) goes there as usual.

Rules: one notice per invocation; an invocation not answered
within ``ttl`` seconds (on the injected clock) expires and its ``on_expire`` runs (Discord
removes its "thinking…" placeholder); a notice arriving after that goes to the conversation
as usual, so nothing is lost. At most ``cap`` invocations wait per adapter (the oldest are
expired first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from channels.base import DeliveryResult, OutboundMessage
from channels.tasks import cancel_and_wait
from runtime.clock import Clock

log = structlog.get_logger(__name__)

Reply = Callable[[str], Awaitable[DeliveryResult]]
# Gateway outcomes no notice follows, and what the invoking user is told then ("" = nothing:
# the placeholder is removed).
SETTLED = {"denied": "This command is not available here.",
           "rejected": "The gateway is restarting; try again in a moment.",
           "failed": "That did not work; the gateway logged why.",
           # a repeated pairing request (the first one got its code, answering this one)
           "pairing": "Your pairing request is waiting for the owner's approval.",
           "duplicate": ""}
Expire = Callable[[], Awaitable[None]]


@dataclass(slots=True)
class _Waiting:
    reply: Reply
    on_expire: Expire | None
    message_id: str | None = None
    timer: asyncio.Task | None = field(default=None, repr=False)


class CommandReplies:
    """The waiting invocations of one adapter. ``ttl``: seconds an invocation may wait for
    its notice (Discord tokens live 15 min, Slack ``response_url`` 30 min)."""

    def __init__(self, clock: Clock, *, ttl: float, cap: int = 256,
                 platform: str = "") -> None:
        self._clock, self._ttl, self._cap, self._platform = clock, ttl, cap, platform
        self._waiting: dict[tuple[str, str | None], list[_Waiting]] = {}
        self._cleanups: set[asyncio.Task] = set()  # strong references to on_expire runs

    def __len__(self) -> int:
        return sum(len(v) for v in self._waiting.values())

    def expect(self, to: str, thread_id: str | None, reply: Reply, *,
               message_id: str | None, on_expire: Expire | None = None) -> object:
        """Register an invocation in conversation ``to``/``thread_id`` whose inbound message
        is ``message_id``; returns its handle for :meth:`settle`."""
        while len(self) >= self._cap:
            oldest = next(iter(self._waiting))
            self._drop(oldest, self._waiting[oldest][0], expired=True)
        waiting = _Waiting(reply, on_expire, message_id)
        self._waiting.setdefault((to, thread_id), []).append(waiting)
        waiting.timer = asyncio.ensure_future(self._expire_later((to, thread_id), waiting))
        return waiting

    def take(self, to: str, thread_id: str | None, message_id: str | None) -> Reply | None:
        """The reply path of the invocation of ``message_id`` waiting in that conversation,
        removed; None when none waits (or ``message_id`` is None)."""
        queue = self._waiting.get((to, thread_id)) or []
        waiting = next((w for w in queue
                        if message_id is not None and w.message_id == message_id), None)
        if waiting is None:
            return None
        self._drop((to, thread_id), waiting, expired=False)
        return waiting.reply

    async def answer(self, message: OutboundMessage) -> DeliveryResult | None:
        """Answer a waiting invocation with ``message`` when it is the text ``notice`` that
        answers it; None when the adapter must send it as usual (not a notice, no
        invocation of ``message.answers`` waiting, or the invocation's reply path failed
        before showing anything)."""
        if message.kind != "notice" or message.media:
            return None
        reply = self.take(message.to, message.thread_id, message.answers)
        if reply is None:
            return None
        result = await reply(message.text)
        if result.ok:
            log.info("native_command_answered", platform=self._platform, to=message.to,
                     thread_id=message.thread_id, parts=len(result.message_ids))
            return result
        log.warning("native_command_answer_failed", platform=self._platform, to=message.to,
                    error=result.error, fallback="conversation")
        return None

    async def settle(self, handle: object, outcome: str | None) -> None:
        """The gateway's ``outcome`` for the invocation ``handle``: one that no notice will
        answer (refused by the access policy, a redelivery, the gateway stopping, a bug)
        answers it now with a short text, or just removes it (a duplicate), instead of
        leaving it waiting for ``ttl``."""
        if outcome not in SETTLED:
            return
        for key, queue in list(self._waiting.items()):
            if handle in queue:
                waiting: _Waiting = handle  # type: ignore[assignment]
                self._drop(key, waiting, expired=outcome == "duplicate")
                text = SETTLED[outcome]
                if text:
                    log.info("native_command_settled", platform=self._platform,
                             to=key[0], outcome=outcome)
                    await waiting.reply(text)
                return

    async def close(self) -> None:
        """Forget every invocation (adapter stop); no ``on_expire`` runs (pending ones are
        cancelled)."""
        timers = [w.timer for q in self._waiting.values() for w in q if w.timer is not None]
        timers += list(self._cleanups)
        self._waiting.clear()
        for timer in timers:
            timer.cancel()
        for timer in timers:
            await cancel_and_wait(timer)

    def _drop(self, key: tuple[str, str | None], waiting: _Waiting, *, expired: bool) -> None:
        queue = self._waiting.get(key, [])
        if waiting in queue:
            queue.remove(waiting)
        if not queue:
            self._waiting.pop(key, None)
        if waiting.timer is not None and waiting.timer is not asyncio.current_task():
            waiting.timer.cancel()
        if expired and waiting.on_expire is not None:
            task = asyncio.ensure_future(self._run_expire(waiting.on_expire, key))
            self._cleanups.add(task)
            task.add_done_callback(self._cleanups.discard)

    async def _expire_later(self, key: tuple[str, str | None], waiting: _Waiting) -> None:
        await self._clock.sleep(self._ttl)
        if waiting in self._waiting.get(key, []):
            log.info("native_command_unanswered", platform=self._platform, to=key[0],
                     thread_id=key[1], waited_s=self._ttl)
            self._drop(key, waiting, expired=True)

    async def _run_expire(self, on_expire: Expire, key: tuple[str, str | None]) -> None:
        try:
            await on_expire()
        except Exception as exc:  # noqa: BLE001 - cosmetic cleanup; the platform expires it too
            log.debug("native_command_expire_failed", platform=self._platform, to=key[0],
                      error=f"{type(exc).__name__}: {exc}")
