"""How a user turn's reply reaches the chat (issue 13): silent replies (``NO_REPLY``),
``reply_to_mode`` quoting, the group-chat prompt note and streamed replies. The turn
executor (gateway/turns/executor.py) opens one :class:`LiveReply` per user turn; everything
platform-specific stays behind the channel adapters (``stream_sender``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from channels.outbound.silent import GROUP_CHAT_NOTE, silent_reply
from gateway.outbound.delivery import Deliverer
from gateway.turns.work import UserWork
from runtime import telemetry
from runtime.clock import Clock
from runtime.events import EventBus, RuntimeEvent

# Streaming, reactions, media uploads and group settings load with the first turn that has
# a chat route: a gateway answering only the HTTP APIs never imports them (issue 9).
if TYPE_CHECKING:
    from channels.base import OutboundMessage
    from channels.outbound.streaming import ReplyStream
    from gateway.outbound.reactions import Acks
    from gateway.outbound.tool_progress import ToolProgress

log = structlog.get_logger(__name__)

_NOTICES = {"error": "⚠️ The reply was cut off: the turn failed.",
            "timeout": "⚠️ The reply was cut off: the turn timed out.",
            "aborted": "⏹ Stopped."}
_background: set[asyncio.Task] = set()


def chat_guidance(chat_type: str) -> str:
    """The prompt note for this kind of chat (group chats learn about ``NO_REPLY``)."""
    return GROUP_CHAT_NOTE if chat_type in ("group", "channel", "thread") else ""


def quoting(reply_to_mode: str, message_id: str | None) -> tuple[str | None, bool]:
    """``(reply_to, reply_to_all)`` for ``reply_to_mode`` off|first|all (OpenClaw's
    semantics: quote the triggering message on no part / the first part / every part)."""
    if reply_to_mode == "off" or not message_id:
        return None, False
    return message_id, reply_to_mode == "all"


def cut_off(streamed: str, status: str) -> str:
    """What a stream that ended with ``status`` (error|timeout|aborted) finally shows: the
    text so far, visibly unfinished, and a notice saying why."""
    notice = _NOTICES.get(status, _NOTICES["error"])
    body = streamed.rstrip()
    return f"{body} …\n\n{notice}" if body else notice


class ReplyFlow:
    """Builds the per-turn :class:`LiveReply`. ``settings(channel, account)`` returns the
    platform account's config (``LiveChatConfig`` fields) or None for local channels."""

    def __init__(self, *, deliverer: Deliverer, settings: Callable[[str, str], Any],
                 clock: Clock | None = None,
                 messages: Callable[[], Any] | None = None) -> None:
        self.deliverer = deliverer
        self.settings = settings
        self.clock = clock or deliverer.clock
        self.messages = messages  # () -> the ``messages`` config section (reactions)

    def guidance(self, work: UserWork) -> str:
        """The prompt's chat note: :func:`chat_guidance` plus the group's configured
        ``groups.<id>.system_prompt`` (operator text, never user text)."""
        note = chat_guidance(work.chat_type)
        cfg = self.settings(work.channel, work.account_id) if work.route else None
        extra = None
        if cfg is not None and work.chat_type != "dm":
            from channels.access.policy import group_settings
            extra = getattr(group_settings(cfg, work.group_id), "system_prompt", None)
        if extra and extra.strip():
            note = f"{note}\n\nInstructions for this group:\n{extra.strip()}".strip()
        return note

    def open(self, work: UserWork, session_key: str, *,
             on_sending: Callable[..., Any] | None = None,
             idempotency_key: str | None = None, verbose: bool | None = None) -> LiveReply:
        """``on_sending(text, stream=False)`` is told before any platform post of the
        reply (the intake journal's ``reply`` mark): before a streamed reply's first piece
        (``stream=True``, text "") and again with the final text; ``idempotency_key``
        goes with every send; ``verbose``: the session's /verbose (tool progress)."""
        cfg = self.settings(work.channel, work.account_id) if work.route else None
        live = LiveReply(self, work, session_key, cfg)
        live.on_sending, live.idempotency_key = on_sending, idempotency_key
        live.verbose = verbose
        return live


class LiveReply:
    """One user turn's reply on its way to the chat."""

    def __init__(self, flow: ReplyFlow, work: UserWork, session_key: str, cfg: Any) -> None:
        self.flow, self.work, self.session_key, self.cfg = flow, work, session_key, cfg
        mode = getattr(self.cfg, "reply_to_mode", "first")
        self.reply_to, self.reply_all = quoting(mode, work.message_id)
        self.stream: ReplyStream | None = None
        self.idempotency_key: str | None = None
        self.on_sending: Callable[..., Any] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self.acks = self._open_acks()
        self.verbose: bool | None = None  # the session's /verbose (None: tool_progress)
        self.progress: ToolProgress | None = None
        self._muted = False  # the message tool answered in this chat: nothing streams

    def _open_acks(self) -> Acks | None:
        route, messages = self.work.route, self.flow.messages
        if route is None or messages is None or self.cfg is None:
            return None
        from gateway.outbound.reactions import Acks
        channel = self.flow.deliverer.find(route.channel, route.account)
        return Acks(channel, route, self.work.message_id, messages(), self.work.chat_type)

    def _outbound(self, text: str = "", media: list[str] | None = None) -> OutboundMessage:
        from channels.base import OutboundMessage
        route = self.work.route
        assert route is not None
        return OutboundMessage(channel=route.channel, to=route.to, text=text,
                               account_id=route.account, thread_id=route.thread,
                               reply_to=self.reply_to, reply_to_all=self.reply_all,
                               session_key=self.session_key, run_id=self.work.run_id,
                               media=list(media or ()),
                               idempotency_key=self.idempotency_key or uuid.uuid4().hex)

    def _open_stream(self) -> ReplyStream | None:
        route, cfg = self.work.route, self.cfg
        streaming = getattr(cfg, "streaming", None)
        if route is None or streaming is None:
            return None
        from channels.outbound.streaming import ReplyStream, stream_mode
        mode = stream_mode(streaming.mode, self.work.chat_type)
        ch = self.flow.deliverer.find(route.channel, route.account)
        factory = getattr(ch, "stream_sender", None)
        sender = factory(self._outbound(), self.work.chat_type, mode=mode,
                         recipient=self.work.sender_id) if factory and mode != "off" else None
        if sender is None:
            return None
        return ReplyStream(sender, mode=mode, clock=self.flow.clock,
                           min_interval=streaming.min_interval, session_key=self.session_key,
                           before_first_post=self._sending_streamed)

    def _open_progress(self) -> ToolProgress | None:
        """The /verbose status line, when on for this session (or by default)."""
        verbose = self.verbose if self.verbose is not None else getattr(
            self.cfg, "tool_progress", False)
        route = self.work.route
        if not verbose or route is None:
            return None
        factory = getattr(self.flow.deliverer.find(route.channel, route.account),
                          "stream_sender", None)
        sender = factory(self._outbound(), self.work.chat_type, mode="status") \
            if factory else None
        if sender is None:
            return None
        from channels.outbound.streaming import ReplyStream
        from gateway.outbound.tool_progress import ToolProgress
        interval = getattr(getattr(self.cfg, "streaming", None), "min_interval", None)
        return ToolProgress(ReplyStream(sender, mode="partial", clock=self.flow.clock,
                                        min_interval=interval, session_key=self.session_key))

    def _sending_streamed(self) -> Any:
        if self.on_sending is not None:  # journaled before the first piece is posted
            return self.on_sending("", stream=True)
        return None

    def _on_event(self, event: RuntimeEvent) -> None:
        if event.type == "tool_execution_start" and self.progress is not None:
            self.progress.tool_started(str(event.data.get("tool") or "tool"),
                                       event.data.get("arguments"))
        stream = self.stream
        if stream is None:
            return
        if event.type in ("tool_execution_end", "message_start") and self._answered_by_tool():
            self._mute(stream)
            return
        if self._muted:
            return
        if event.type == "message_update":
            stream.feed(str(event.data.get("delta") or ""))
        elif event.type == "message_start" and event.data.get("round", 1) > 1:
            stream.new_round()
        elif event.type == "model_error":
            stream.restart()  # a retry (or the next profile/model) starts the text afresh

    def _answered_by_tool(self) -> bool:
        """The turn sent to its own chat with the message tool: its final text is then
        not delivered there (``reached_by_tool``), so it is not streamed either."""
        route = self.work.route
        return not self._muted and route is not None and \
            self.flow.deliverer.tool_sent_to(self.session_key, route)

    def _mute(self, stream: ReplyStream) -> None:
        """Stop streaming this turn and remove what the stream shows (a draft, interim
        text); a final text that still goes out (files attached) is sent normally."""
        self._muted = True
        task = asyncio.ensure_future(stream.discard())
        _background.add(task)
        task.add_done_callback(_background.discard)
        log.info("stream_muted", session_key=self.session_key, run_id=self.work.run_id,
                 reason="the turn sent to this chat with the message tool")

    @contextlib.asynccontextmanager
    async def running(self, bus: EventBus, run_id: str) -> AsyncIterator[None]:
        """Around the turn: stream its deltas (subscribing to the run's events is what
        makes the model call stream). A turn cancelled mid-stream (/stop, shutdown)
        leaves a final message saying it stopped."""
        if self.acks is not None:
            self.acks.started()
        self.stream, self.progress = self._open_stream(), self._open_progress()
        if self.stream is not None or self.progress is not None:
            self._unsubscribe = bus.subscribe(self._on_event, run_id)
        for part in (self.stream, self.progress):
            if part is not None:
                part.start()
        try:
            yield
        except BaseException:
            if self.acks is not None:
                self.acks.ended(silent=True)
            stream = self._end_subscription()
            if stream is not None or self.progress is not None:
                task = asyncio.ensure_future(self._stopped(stream))
                _background.add(task)
                task.add_done_callback(_background.discard)
            raise
        self._end_subscription()
        if self.progress is not None:
            await self.progress.close()

    def _end_subscription(self) -> ReplyStream | None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        return self.stream

    async def _stopped(self, stream: ReplyStream | None) -> None:
        if self.progress is not None:
            await self.progress.close()
        if stream is None:
            return
        if stream.visible and not await self._finish_stream(stream,
                                                            cut_off(stream.text, "aborted")):
            await self._send(cut_off(stream.text, "aborted"))
        elif not stream.visible:
            await stream.discard()

    async def finish(self, result: Any, *, workspace: Path | None = None,
                     files: Any = None) -> str:
        """Deliver ``result.text`` (a TurnResult; None: nothing to deliver, e.g. the
        message tool already sent it) unless it is a silent reply: through the stream when
        it showed something, else as one normal send (outbox on failure). ``MEDIA:`` lines
        name files of ``workspace`` to upload after the text, checked with ``files``
        (gateway/outbound/media.py OutboundFiles: a file holding a secret is not sent).
        ``on_sending`` (see :meth:`ReplyFlow.open`) is told the text before it goes out.
        Returns what became of it: ``none`` (nothing to deliver), ``silent``,
        ``streamed``, ``delivered``, ``queued`` (outbox), ``unconfirmed`` or
        ``failed: <error>``."""
        route = self.work.route
        stream = self.stream
        if route is None or result is None:
            if stream is not None:
                await stream.discard()
            return "none"
        verdict = silent_reply(result.text)
        if self.acks is not None:
            self.acks.ended(silent=verdict.silent)
        if verdict.silent:
            if stream is not None:
                await stream.discard()
            if result.text.strip():
                log.info("reply_silent", session_key=self.session_key, run_id=result.run_id,
                         streamed=bool(stream and stream.calls))
            return "silent"
        text, media = verdict.text, []
        if workspace is not None:
            from gateway.outbound.media import OutboundFiles, reply_with_media
            from runtime.tools.secrets import NO_SECRETS
            text, media = reply_with_media(workspace, route.channel, text,
                                           files or OutboundFiles(NO_SECRETS))
        if stream is not None:
            await stream.settle()  # a first post in flight counts as shown
        streamed = stream is not None and stream.visible
        if self.on_sending is not None:
            # Only drafts were shown (nothing lasting in the chat): marked "draft" now (a
            # crash before the final post: the text is posted by the resume/takeover), and
            # as a stream right before the final post, after the stream's throttle wait.
            draft = streamed and not stream.posted
            if draft:
                stream._before_first_post = lambda: self.on_sending(text, stream=True)
            mark = self.on_sending(text, stream="draft" if draft else streamed)
            if inspect.isawaitable(mark):
                await mark  # replicas: durable in PostgreSQL before the send
        if stream is not None and stream.visible:
            if result.status != "ok":
                text = cut_off(stream.text, result.status)
            done = await self._finish_stream(stream, text)
            log.info("stream_finished", session_key=self.session_key, run_id=result.run_id,
                     delivered=done, **stream.stats())
            if done:
                self.flow.deliverer.note_streamed(route, parts=stream.stats()["messages"],
                                                  session_key=self.session_key,
                                                  run_id=result.run_id)
            if done and not media:
                return "streamed"
            if done:
                text = ""  # the text is shown; the files follow as their own message
        elif stream is not None:
            await stream.discard()
        if stream is not None and stream.broken is not None and not self._after_failed(
                stream, route, text, media):
            return "unconfirmed" if stream.unconfirmed else \
                f"failed: {stream.broken}" if stream.permanent else "queued"
        return await self._send(text, media)

    async def _finish_stream(self, stream: ReplyStream, text: str) -> bool:
        """``stream.finish(text)`` inside a ``platform.send`` span (as a normal send has:
        kind, ok, parts, ``streamed``; the text only with ``include_content``)."""
        channel = self.work.route.channel if self.work.route is not None else self.work.channel
        with telemetry.span("platform.send", {"tidegate.channel": channel,
                                              "tidegate.send.kind": "reply",
                                              "tidegate.send.streamed": True}) as sp:
            done = await stream.finish(text)
            sp.set_attributes({"tidegate.send.ok": bool(done),
                               "tidegate.send.parts": int(stream.stats()["messages"])})
            telemetry.content(sp, {"tidegate.send.text": text})
        return done

    def _after_failed(self, stream: ReplyStream, route: Any, text: str,
                      media: list[str]) -> bool:
        """The stream failed: True when ``text`` is to be sent normally now. A post whose
        outcome is unknown may be in the chat, so nothing is sent twice (unconfirmed); a
        refused one (already retried by the library) goes to the outbox, which retries
        later instead of a second long attempt now."""
        if stream.unconfirmed:
            self.flow.deliverer.record_unconfirmed(
                route.channel, route.to, session_key=self.session_key,
                reason=f"stream: {stream.broken}", run_id=self.work.run_id)
            return False
        if stream.permanent:  # it would fail the same way from the outbox, forever
            self.flow.deliverer.failed += 1
            log.error("delivery_failed", channel=route.channel, to=route.to,
                      error=stream.broken, session_key=self.session_key, permanent=True)
            return False
        outbox = self.flow.deliverer.outbox
        if outbox is None:
            return True
        outbox.put(self._outbound(text, media), f"stream failed: {stream.broken}")
        log.warning("delivery_queued_in_outbox", channel=self.work.channel,
                    error=stream.broken, session_key=self.session_key)
        return False

    async def _send(self, text: str, media: list[str] | None = None) -> str:
        """Send normally; returns ``delivered``, ``unconfirmed``, ``queued`` or
        ``failed: <error>``."""
        route = self.work.route
        assert route is not None
        sent = await self.flow.deliverer.send(route, text, session_key=self.session_key,
                                              run_id=self.work.run_id, reply_to=self.reply_to,
                                              reply_to_all=self.reply_all, media=media,
                                              idempotency_key=self.idempotency_key)
        return delivery_word(sent, self.flow.deliverer.outbox is not None)


def delivery_word(sent: Any, outbox: bool) -> str:
    """What a DeliveryResult means for the message: ``delivered``, ``unconfirmed``,
    ``queued`` (retried from the outbox) or ``failed: <error>``."""
    if sent.ok:
        return "delivered"
    if sent.unconfirmed:
        return "unconfirmed"
    return "queued" if sent.retryable and outbox else f"failed: {sent.error}"
