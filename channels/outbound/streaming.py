"""Streamed replies, platform-independent (issue 13 "Streamed replies").

A :class:`ReplyStream` takes the model's text deltas of one turn (``feed``) and keeps the
chat in step through a small platform :class:`StreamSender` (channels/<platform>/stream.py):

- ``partial``: the reply grows in place. The text so far is rendered exactly as a final
  reply would be (``render_chunks``: platform markup, limit, fences closed and reopened);
  message *i* shows part *i*. When the text outgrows the limit, part 0 is finalised and
  part 1 continues in a new message.
- ``block``: each finished paragraph/block (a blank line outside a code fence) goes out as
  its own message; blocks finished within one interval are coalesced into one message.

Platform calls are throttled per stream: at most one flush per ``min_interval`` seconds
(deltas arriving meanwhile are coalesced into the next flush); a 429 (``RateLimited``)
postpones only this stream by ``retry_after``; rejected markup is shown plain. Time comes
from the injected clock. ``finish(text)`` reconciles the messages with the final text (so
the result equals a non-streamed reply), ``discard()`` removes what was shown (a reply that
turned out silent). A reply that may still become a silent token (``NO_REPLY``,
``HEARTBEAT_OK``) is never shown (channels/outbound/silent.py).
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from channels.outbound.delivery import MarkupRejected, RateLimited, is_retryable
from channels.outbound.render import render_chunks
from channels.outbound.send_outcome import outcome_unknown
from channels.outbound.silent import may_become_silent
from runtime.clock import Clock

log = structlog.get_logger(__name__)

DEFAULT_MIN_INTERVAL = {"telegram": 1.0, "discord": 1.0, "slack": 1.0, "matrix": 1.0}
_FENCE = re.compile(r"^\s*(```|~~~)", re.MULTILINE)


class StreamSender(Protocol):
    """One streamed reply's messages on one platform. ``platform`` names the
    ``render_chunks`` rules; a sender with ``markdown = True`` (Slack's native streaming)
    gets the model's raw text as one growing part instead. Errors: RateLimited (429), MarkupRejected (resend plain),
    anything else ends the stream (the gateway then delivers normally)."""

    platform: str

    async def show(self, index: int, text: str, *, formatted: bool, final: bool) -> None:
        """Create message ``index`` or update it to ``text``. ``final``: this is the part's
        lasting form (a draft becomes a real message). Unchanged text costs no call."""

    async def discard(self, index: int) -> None:
        """Remove message ``index`` (delete a posted message; a draft just lapses)."""


def stream_mode(configured: str | None, chat_type: str) -> str:
    """``off`` | ``partial`` | ``block``: the configured mode, else partial in DMs and
    block in groups/channels/threads."""
    if configured:
        return configured
    return "partial" if chat_type == "dm" else "block"


def finished_blocks_end(text: str, start: int = 0) -> int:
    """End of the last finished block in ``text`` after ``start``: the position after the
    last blank line that is outside a code fence (``start`` when there is none)."""
    end, pos = start, start
    while True:
        i = text.find("\n\n", pos)
        if i < 0:
            return end
        if len(_FENCE.findall(text, 0, i)) % 2 == 0:
            end = i + 2
        pos = i + 2


class ReplyStream:
    """One turn's streamed reply. ``feed``/``new_round`` are plain calls (the runtime event
    bus is synchronous); ``start`` launches the flushing task on the running loop."""

    def __init__(self, sender: StreamSender, *, mode: str, clock: Clock,
                 min_interval: float | None = None, session_key: str | None = None,
                 before_first_post: Callable[[], Any] | None = None) -> None:
        self.sender, self.mode, self.clock = sender, mode, clock
        self._before_first_post = before_first_post  # the intake journal's reply mark
        self.min_interval = (DEFAULT_MIN_INTERVAL.get(sender.platform, 1.0)
                             if min_interval is None else min_interval)
        self.session_key = session_key
        self.text = ""  # the current model round's text
        self.calls = 0  # platform calls made (bench: edits per streamed reply)
        self.first_visible_at: float | None = None  # monotonic time of the first call
        self.first_delta_at: float | None = None  # monotonic time of the first delta
        self.broken: str | None = None
        self.posted = False  # a lasting message was posted (not only an ephemeral draft)
        self.unconfirmed = False  # the failed call may have reached the chat
        self.permanent = False  # the platform refused for good (chat not found...): no retry
        self._fresh_round = False
        self._restart = False  # the model call was retried: its next text starts afresh
        self._round_start = 0  # block mode: the first message index of the current round
        self._stale: list[int] = []  # block messages of a retried attempt, to remove
        self._shown: dict[int, tuple[str, bool]] = {}
        self._block_pos = 0
        self._next_index = 0
        self._next_at = 0.0
        self._dirty = asyncio.Event()
        self._lock = asyncio.Lock()
        self._closing = False
        self._task: asyncio.Task | None = None

    # -- input (synchronous) ---------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def feed(self, delta: str) -> None:
        if self._fresh_round:
            # A new model round (after tools): partial mode overwrites the interim text in
            # place; block mode keeps the blocks already sent and continues after them.
            self._fresh_round = self._restart = False
            self.text, self._block_pos = "", 0
            self._round_start = self._next_index
        elif self._restart:
            # A retried attempt starts its answer again: it replaces the failed attempt's
            # text (partial: in place; block: that attempt's messages are removed).
            self._restart = False
            self.text, self._block_pos = "", 0
            self._stale += [i for i in range(self._round_start, self._next_index)
                            if i in self._shown]
            self._round_start = self._next_index
        if self.first_delta_at is None:
            self.first_delta_at = self.clock.monotonic()
        self.text += delta
        self._dirty.set()

    def replace(self, text: str) -> None:
        """Show ``text`` instead of what was fed so far (a status line)."""
        if self.first_delta_at is None:
            self.first_delta_at = self.clock.monotonic()
        self.text, self._fresh_round = text, False
        self._dirty.set()

    def new_round(self) -> None:
        self._fresh_round = True

    def restart(self) -> None:
        """The round's model call failed and may be retried: the next attempt's text
        replaces this attempt's from empty (never appended to it). Lazy, at the next
        ``feed``: when no attempt follows, the text so far stays (a cut-off reply shows
        the last attempt's text and its notice)."""
        self._restart = True

    @property
    def visible(self) -> bool:
        return bool(self._shown)

    # -- the flushing task -----------------------------------------------------------------
    async def _run(self) -> None:
        while not self._closing and self.broken is None:
            await self._dirty.wait()
            self._dirty.clear()
            wait = self._next_at - self.clock.monotonic()
            if wait > 0:
                await self.clock.sleep(wait)  # deltas arriving meanwhile coalesce
            async with self._lock:
                if self._closing:
                    return
                await self._flush(self.text, final=False)

    async def _flush(self, text: str, *, final: bool) -> bool:
        """Bring the messages in line with ``text``; False when a call failed."""
        while self._stale:
            await self._discard(self._stale.pop(0))
        if may_become_silent(text) and not final:
            return True
        if self.mode == "block":
            return await self._flush_blocks(text, final=final)
        if getattr(self.sender, "markdown", False):  # the platform renders Markdown itself
            return await self._show(0, text, text, final)
        chunks = render_chunks(text, self.sender.platform)
        for i, chunk in enumerate(chunks):
            settled = final or i < len(chunks) - 1
            if not await self._show(i, chunk.formatted, chunk.plain, settled):
                return False
        if final:
            for i in sorted(k for k in self._shown if k >= len(chunks)):
                await self._discard(i)
        return True

    async def _flush_blocks(self, text: str, *, final: bool) -> bool:
        if final and not text.startswith(self.text[:self._block_pos]):
            self._block_pos = 0  # the final text is not what was streamed: send it whole
            text = text.strip()
        end = len(text) if final else finished_blocks_end(text, self._block_pos)
        piece = text[self._block_pos:end].strip()
        if piece:
            chunks = render_chunks(piece, self.sender.platform)
            for j, chunk in enumerate(chunks):
                if not await self._show(self._next_index + j, chunk.formatted, chunk.plain,
                                        True):
                    return False
            self._next_index += len(chunks)
        self._block_pos = max(self._block_pos, end)
        return True

    async def _show(self, index: int, formatted: str, plain: str, final: bool) -> bool:
        if self._shown.get(index) in ((formatted, final), (plain, final)):
            return True
        # A draft (Telegram sendMessageDraft) lapses when the process dies: nothing is in
        # the chat yet, so the journal's reply mark waits for the first lasting post. Marked
        # before a draft, a crash in the throttle wait before the final post (~1 s of every
        # reply) left the message unanswered: resolved as a cut stream, never re-run.
        lasting = getattr(self.sender, "lasting", None)
        lasting = lasting(index, final) if lasting is not None else True
        if lasting and self._before_first_post is not None:
            announce, self._before_first_post = self._before_first_post, None
            mark = announce()
            if inspect.isawaitable(mark):
                await mark  # replicas: the journal mark is durable before the first post
        try:
            try:
                await self.sender.show(index, formatted, formatted=True, final=final)
                shown = formatted
            except MarkupRejected as exc:
                log.warning("stream_markup_rejected", session_key=self.session_key,
                            error=str(exc))
                await self.sender.show(index, plain, formatted=False, final=final)
                shown = plain
        except RateLimited as exc:
            self._next_at = self.clock.monotonic() + exc.retry_after
            log.warning("stream_rate_limited", session_key=self.session_key,
                        retry_after=exc.retry_after, platform=self.sender.platform)
            self._dirty.set()
            return False
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the gateway falls back to a plain send
            self.broken = f"{type(exc).__name__}: {exc}"
            self.unconfirmed = outcome_unknown(exc)  # it may be in the chat: never resent
            self.permanent = not self.unconfirmed and not is_retryable(exc)
            log.warning("stream_failed", session_key=self.session_key, error=self.broken,
                        platform=self.sender.platform)
            return False
        self._shown[index] = (shown, final)
        self.posted = self.posted or lasting
        self.calls += 1
        now = self.clock.monotonic()
        if self.first_visible_at is None:
            self.first_visible_at = now
        self._next_at = now + self.min_interval
        return True

    async def _discard(self, index: int) -> None:
        try:
            await self.sender.discard(index)
            self.calls += 1
        except Exception as exc:  # noqa: BLE001 - best effort
            log.warning("stream_discard_failed", session_key=self.session_key,
                        error=f"{type(exc).__name__}: {exc}")
        self._shown.pop(index, None)

    # -- the end -----------------------------------------------------------------------------
    async def _stop_task(self) -> None:
        self._closing = True
        self._dirty.set()
        task, self._task = self._task, None
        if task is not None and not task.done():
            async with self._lock:
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def settle(self) -> None:
        """Stop the flushing task; a platform call in flight completes first, so
        ``visible`` is then final."""
        await self._stop_task()

    async def finish(self, text: str, *, attempts: int = 3) -> bool:
        """Make the messages show exactly ``text`` (model Markdown, rendered like a
        non-streamed reply). Waits out a pending 429 (clock). Returns False when the stream
        could not deliver it (the caller sends ``text`` normally; what the stream showed
        is removed first)."""
        await self._stop_task()
        async with self._lock:
            for _ in range(attempts):
                if self.broken is not None:
                    break
                wait = self._next_at - self.clock.monotonic()
                if wait > 0:
                    await self.clock.sleep(wait)
                if await self._flush(text, final=True):
                    return True
            for i in sorted(self._shown):
                await self._discard(i)
            return False

    async def discard(self) -> None:
        """Remove everything the stream showed (the reply turned out silent)."""
        await self._stop_task()
        async with self._lock:
            for i in sorted(self._shown):
                await self._discard(i)

    def stats(self) -> dict[str, Any]:
        """``calls`` (platform calls), ``messages`` shown, ``mode``, ``first_text_ms``
        (first delta -> first visible text, None when nothing was shown)."""
        latency = None
        if self.first_visible_at is not None and self.first_delta_at is not None:
            latency = round((self.first_visible_at - self.first_delta_at) * 1000, 2)
        return {"calls": self.calls, "messages": len(self._shown), "mode": self.mode,
                "first_text_ms": latency}
