"""The Slack channel adapter (slack-bolt 1.30 async + slack-sdk 3.48): Socket Mode or the
HTTP Events API in, ``chat.postMessage`` out.

One ``SlackChannel`` per configured account (``channels.slack`` /
``channels.slack.accounts.<id>``, see channels/config.py ``SlackAccount``). Events go through a
bolt ``AsyncApp`` (acks, self-event filtering; channels/slack/inbound.py) into one ordered
worker that normalises them (channels/slack/events.py) and hands ``InboundMessage`` /
``ChannelEvent`` to the gateway. Replies go out through channels/slack/send.py
(``render_chunks("slack")`` + ``send_chunks``). Contract: issue 3; wire behaviour:
https://docs.slack.dev.

The connection is supervised by channels/slack/connection.py (auth.test, socket, backoff
on the injected clock); the outbound methods live in channels/slack/outbound.py. This module
holds the lifecycle, the ordered inbound worker and the HTTP Events API route.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import (
    ChannelState,
    EventHandler,
    InboundHandler,
)
from channels.inbound.command_replies import CommandReplies
from channels.outbound.reply_threads import answer_in_thread
from channels.reconnects import ConnectionCount
from channels.slack.api import UserNames, describe_error
from channels.slack.buttons import close_buttons, press_of, send_buttons
from channels.slack.commands import URL_TTL, expect_answer
from channels.slack.config import SlackAccount
from channels.slack.connection import SlackConnection
from channels.slack.events import (
    BotIdentity,
    MalformedEvent,
    command_to_inbound,
    to_channel_event,
    to_inbound,
)
from channels.slack.inbound import AckWithheld, build_app, handle_events_request
from channels.slack.media import media_of
from channels.slack.outbound import SlackSending
from channels.slack.pacing import TierPacer
from channels.slack.send import TypingStatus
from runtime.clock import SYSTEM_CLOCK, Clock, utc_iso

log = structlog.get_logger(__name__)

ACCEPT_WAIT = 2.5  # s an event waits for the gateway's acceptance before its ack is withheld


class SlackChannel(SlackConnection, SlackSending):
    """One Slack account (bot token + app token for Socket Mode, or signing secret for the
    HTTP Events API).

    ``reconnect_initial``/``reconnect_max`` bound the reconnect backoff (seconds, doubled per
    failure, jitter 50-100 %); ``watch_interval`` is how often a quiet socket is checked;
    ``connect_timeout`` bounds one auth + connect attempt; ``ping_interval`` is the SDK's
    WebSocket ping period. Raises ValueError when the tokens the mode needs are missing.
    """

    name = "slack"

    def __init__(self, account_id: str, config: SlackAccount, *, clock: Clock = SYSTEM_CLOCK,
                 reconnect_initial: float = 1.0, reconnect_max: float = 60.0,
                 watch_interval: float = 5.0, connect_timeout: float = 30.0,
                 ping_interval: float = 10.0, media: Any = None) -> None:
        where = f"channels.slack account {account_id!r}"
        if not config.bot_token:
            raise ValueError(f"{where}: bot_token is required")
        if config.mode == "socket" and not config.app_token:
            raise ValueError(f"{where}: app_token (xapp-...) is required for mode socket")
        if config.mode == "http" and not config.signing_secret:
            raise ValueError(f"{where}: signing_secret is required for mode http")
        self.account_id = account_id
        self.config = config
        self.state: ChannelState = "stopped" if config.enabled else "disabled"
        self._clock = clock
        # Without the slash older slack-sdk releases drop the last path segment.
        self._base_url = config.api_base_url.rstrip("/") + "/"
        self._backoff = (reconnect_initial, reconnect_max)
        self._watch_interval, self._connect_timeout = watch_interval, connect_timeout
        self._ping_interval = ping_interval
        self._bot: BotIdentity | None = None
        self._last_error: str | None = None
        self._connected_since: float | None = None
        self._connects = ConnectionCount()
        self._on_message: InboundHandler | None = None
        self._on_event: EventHandler | None = None
        self._http: aiohttp.ClientSession | None = None
        self._web: AsyncWebClient | None = None
        self._app: AsyncApp | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._names: UserNames | None = None
        self._queue: asyncio.Queue[tuple[str, dict[str, Any], float, asyncio.Future]] = \
            asyncio.Queue()
        self._inflight: dict[str, asyncio.Future] = {}  # event_id -> acceptance, until done
        self._tasks: set[asyncio.Task[Any]] = set()
        self._supervisor: asyncio.Task[None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._first_attempt = asyncio.Event()
        self._stopping = False
        self._dm_channels: dict[str, str] = {}  # user id -> IM channel id, from inbound DMs
        self.on_press: Any = None  # the gateway's ButtonPress handler (channels/base.py)
        self._typing: TypingStatus | None = None
        self._command_replies = CommandReplies(clock, ttl=URL_TTL, platform="slack")
        self._pacer = TierPacer(clock)  # streamed calls by Slack's tiers (pacing.py)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, on_message: InboundHandler, on_event: EventHandler) -> None:
        """Authenticate and connect; return once connected, failed, or retrying in the
        background. Never raises for network or token trouble (see ``state``)."""
        if not self.config.enabled:
            self.state = "disabled"
            return
        if self._supervisor is not None:
            return
        self._on_message, self._on_event = on_message, on_event
        self._stopping = False
        self._first_attempt = asyncio.Event()
        self._queue = asyncio.Queue()
        self._inflight = {}
        self._wake.clear()
        self.state = "starting"
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=max(self.config.send_timeout, 1.0) + 5.0))
        self._web = AsyncWebClient(token=self.config.bot_token, base_url=self._base_url,
                                   session=self._http, retry_handlers=[])
        self._names = UserNames(self._web, self._clock, account_id=self.account_id)
        self._typing = TypingStatus(self._web, self._clock, account_id=self.account_id)
        self._app = build_app(base_url=self._base_url, session=self._http,
                              bot_token=self.config.bot_token or "",
                              get_bot=lambda: self._bot, enqueue=self._enqueue,
                              account_id=self.account_id, on_action=self._on_action)
        if self.config.mode == "socket":
            self._socket = AsyncSocketModeHandler(
                self._app, app_token=self.config.app_token, web_client=self._app.client,
                ping_interval=self._ping_interval)
            client = self._socket.client
            client.default_auto_reconnect_enabled = False  # the supervisor reconnects
            client.auto_reconnect_enabled = False
            client.on_close_listeners.append(self._socket_dropped)
            client.on_error_listeners.append(self._socket_dropped)
        self._worker = asyncio.create_task(self._work(), name=f"slack-{self.account_id}-events")
        self._supervisor = asyncio.create_task(self._supervise(),
                                               name=f"slack-{self.account_id}-connection")
        await self._first_attempt.wait()

    async def stop(self) -> None:
        """Disconnect and release everything; idempotent."""
        self._stopping = True
        self._wake.set()
        tasks = [t for t in (self._supervisor, self._worker, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._supervisor = self._worker = None
        self._tasks.clear()
        if self._socket is not None:
            try:
                await self._socket.close_async()
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                log.debug("slack_socket_close_failed", account_id=self.account_id,
                          error=describe_error(exc))
            self._socket = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        self._web = self._app = None
        self._typing = None
        await self._command_replies.close()
        if self.state != "disabled":
            self.state = "stopped"
        self._connected_since = None

    # ------------------------------------------------------------------ buttons
    def _on_action(self, body: dict[str, Any]) -> None:
        """A ``block_actions`` payload: the press goes to ``on_press`` in a task (the
        payload is acked already)."""
        press = press_of(body, account_id=self.account_id, session=self._http,
                         api_base_url=self._base_url)
        if press is None or self.on_press is None:
            return
        task = asyncio.get_running_loop().create_task(self.on_press(press))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def send_buttons(self, to: str, text: str, buttons: list[Any]) -> str:
        """channels/base.py ``ButtonChannel`` (channels/slack/buttons.py)."""
        if self._web is None or self.state != "connected":
            raise RuntimeError("slack channel is not connected")
        return await send_buttons(self._web, self._dm_channels.get(to, to), text, buttons)

    async def close_buttons(self, to: str, message_id: str, text: str) -> None:
        if self._web is None:
            raise RuntimeError("slack channel is not running")
        await close_buttons(self._web, message_id, text)

    # ------------------------------------------------------------------ inbound

    async def _enqueue(self, kind: str, body: dict[str, Any]) -> None:
        """Queue a payload for the worker; returns once the gateway accepted (journaled) it,
        and bolt then acks it. Raises AckWithheld when that takes more than ACCEPT_WAIT
        seconds (a storage outage): an ack must never go out for a message a crash could
        still lose, so Slack's 3 s ack deadline passes and Slack delivers the event again.

        Slack's side (https://docs.slack.dev/apis/events-api, "Error handling" / retries,
        and https://docs.slack.dev/apis/events-api/using-socket-mode): an event that is
        not acknowledged within 3 s (Socket Mode: no ``envelope_id`` ack; HTTP: no 2xx,
        header ``X-Slack-Retry-Num``/``X-Slack-Retry-Reason`` on the retry) is delivered
        again with the same ``event_id`` and ``retry_attempt`` + 1, up to 3 retries (nearly
        at once, after about 1 and about 5 minutes). Slash commands are not retried: the
        user sees Slack's timeout notice, and the command still runs if it is accepted late.

        The original keeps going to the gateway while Slack retries. A redelivery that
        arrives while it is still pending (same ``event_id``) is not queued again: it waits
        for the same acceptance, and is acked once that is done. One that arrives after it
        (or after a restart) is queued and the gateway's dedupe (channels/inbound/dedupe.py,
        by channel + message ts) drops it as a duplicate, so it is acked without a rerun.
        """
        event_id = body.get("event_id") if kind == "event" else None
        accepted = self._inflight.get(event_id) if isinstance(event_id, str) else None
        if accepted is None:
            accepted = asyncio.get_running_loop().create_future()
            self._queue.put_nowait((kind, body, self._clock.time(), accepted))
            if isinstance(event_id, str):
                self._inflight[event_id] = accepted
                inflight = self._inflight
                accepted.add_done_callback(
                    lambda f: inflight.pop(event_id) if inflight.get(event_id) is f else None)
        else:
            log.info("slack_redelivery_joined", account_id=self.account_id, event_id=event_id)
        started = self._clock.monotonic()
        try:
            async with self._clock.timeout(ACCEPT_WAIT):
                await asyncio.shield(accepted)
        except (TimeoutError, AckWithheld) as exc:  # AckWithheld: the adapter is stopping
            log.warning("slack_ack_withheld", account_id=self.account_id, kind=kind,
                        event_id=event_id, waited_s=round(self._clock.monotonic() - started, 3),
                        reason="stopping" if isinstance(exc, AckWithheld) else "not accepted",
                        effect="not acknowledged: Slack delivers it again")
            raise AckWithheld(f"not accepted within {ACCEPT_WAIT:g}s") from None

    async def _work(self) -> None:
        # One worker keeps Slack's order; handlers run as tasks so a slow one blocks nobody.
        while True:
            kind, body, received_at, accepted = await self._queue.get()
            handed = False
            try:
                handed = await self.dispatch(kind, body, received_at, accepted)
            except asyncio.CancelledError:
                _withhold(accepted)  # stopping before the gateway had it: no ack
                raise
            except MalformedEvent as exc:
                log.warning("slack_event_malformed", account_id=self.account_id,
                            event_id=body.get("event_id"), error=str(exc))
            except Exception as exc:  # one bad event must not stop the rest
                log.exception("slack_event_failed", account_id=self.account_id,
                              event_id=body.get("event_id"), error=describe_error(exc))
            finally:
                if not handed:
                    _resolve(accepted)

    async def dispatch(self, kind: str, body: dict[str, Any], received_at: float,
                       accepted: asyncio.Future | None = None) -> bool:
        """Normalise one bolt payload (``kind`` ``event`` or ``command``) and hand it to the
        gateway. Returns True when a message went to the gateway, which then resolves
        ``accepted`` once ``on_message`` returned (the gateway journaled it). Raises
        MalformedEvent for payloads missing what we need."""
        bot = self._bot
        if bot is None:
            return False
        if kind == "command":
            msg = command_to_inbound(body, account_id=self.account_id, received_at=received_at)
            handle = expect_answer(self._command_replies, msg, body, session=self._http,
                                   api_base_url=self._base_url, clock=self._clock,
                                   timeout=self.config.send_timeout, account_id=self.account_id)
            if msg.chat_type == "dm":
                self._dm_channels[msg.sender_id] = str(body.get("channel_id"))
            self._spawn(self._deliver_message(msg, accepted, handle))
            return True
        event = body.get("event")
        if not isinstance(event, dict):
            raise MalformedEvent("'event' is not an object")
        etype, subtype = event.get("type"), event.get("subtype")
        if etype in ("message", "app_mention") and subtype not in (
                "message_changed", "message_deleted"):
            msg = to_inbound(event, bot=bot, account_id=self.account_id,
                             received_at=received_at, raw=body)
            if msg is None:
                return False
            msg.media = media_of(event, self.config.bot_token or "", self._base_url)
            if self.config.reply_in_thread:
                msg = answer_in_thread(msg)
            if msg.chat_type == "dm" and isinstance(event.get("channel"), str):
                if len(self._dm_channels) >= 10_000:
                    self._dm_channels.clear()  # bounded; Slack also accepts user ids
                self._dm_channels[msg.sender_id] = event["channel"]
            if self._names is not None and msg.sender_id.startswith(("U", "W")):
                name, username = await self._names.lookup(msg.sender_id)
                msg.sender_name = msg.sender_name or name
                msg.sender_username = msg.sender_username or username
            self._spawn(self._deliver_message(msg, accepted))
            return True
        ev = to_channel_event(event, bot=bot, account_id=self.account_id)
        if ev is not None and self._on_event is not None:
            self._spawn(self._guard(self._on_event(ev), "on_event"))
        return False

    async def _deliver_message(self, msg: Any, accepted: asyncio.Future | None,
                               command: object | None = None) -> None:
        outcome: Any = None
        try:
            if self._on_message is not None:
                outcome = await self._guard(self._on_message(msg), "on_message",
                                            failed="failed")
        except asyncio.CancelledError:
            _withhold(accepted)  # stopped before the gateway accepted it: no ack
            raise
        finally:
            _resolve(accepted)
        if command is not None:  # a slash command no notice will answer is answered now
            await self._command_replies.settle(command, outcome)

    async def _guard(self, coro: Awaitable[Any], what: str, failed: Any = None) -> Any:
        """``await coro``; its result, or ``failed`` after logging a handler bug."""
        try:
            return await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a handler bug must not kill the adapter
            log.exception("slack_handler_failed", account_id=self.account_id, handler=what,
                          error=describe_error(exc))
            return failed

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ HTTP Events API

    def http_routes(self) -> list[web.RouteDef]:
        """HTTP mode: ``POST <events_path>`` for the Events API (and slash commands).
        Socket mode: none."""
        if self.config.mode != "http":
            return []
        return [web.post(self.config.events_path, self._handle_http)]

    async def _handle_http(self, request: web.Request) -> web.Response:
        """Slack's Events API and slash commands (HTTP mode): the request signature is checked
        (401 otherwise); the answer is 200 once the gateway accepted the payload, 503 when
        it did not within ACCEPT_WAIT (Slack retries; see ``_enqueue``)."""
        ready = self._app if self._bot is not None else None
        return await handle_events_request(
            request, app=ready, signing_secret=self.config.signing_secret or "",
            clock=self._clock, account_id=self.account_id)

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        """``state``, ``account_id``, ``bot_id`` (the bot's user id, U…), ``bot_username``,
        ``last_error``, ``connected_since`` (RFC 3339 or None), plus ``mode``, ``team_id``
        and ``slack_bot_id`` (B…)."""
        bot = self._bot
        return {
            "state": self.state,
            "account_id": self.account_id,
            "bot_id": bot.user_id if bot else None,
            "bot_username": bot.username if bot else None,
            "last_error": self._last_error,
            "connected_since": (utc_iso(self._connected_since)
                                if self._connected_since is not None else None),
            "mode": self.config.mode,
            "team_id": bot.team_id if bot else None,
            "slack_bot_id": bot.bot_id if bot else None,
            "reconnects": self._connects.reconnects,
        }


def _resolve(fut: asyncio.Future | None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


def _withhold(fut: asyncio.Future | None) -> None:
    """The payload will not be accepted by this run (the adapter is stopping): a listener
    still waiting fails with AckWithheld, so no ack goes out."""
    if fut is not None and not fut.done():
        fut.set_exception(AckWithheld("the adapter stopped before the gateway accepted it"))
        fut.exception()  # retrieved: nobody may be waiting any more
