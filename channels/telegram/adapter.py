"""The Telegram channel adapter (python-telegram-bot 22.x, Bot API long polling or webhook).

One ``TelegramChannel`` per configured account (``channels.telegram`` /
``channels.telegram.accounts.<id>``, see channels/config.py ``TelegramAccount``). It turns
updates into ``InboundMessage`` / ``ChannelEvent`` (channels/telegram/normalize.py) and
delivers ``OutboundMessage`` through ``render_chunks`` + ``send_chunks``
(channels/outbound/render.py, channels/outbound/delivery.py). Issue 3 gives the contract; the Bot API
reference (https://core.telegram.org/bots/api) the wire behaviour.

Polling is driven here (``getUpdates`` in a task) rather than through PTB's
``Application``/``Updater`` because the Updater (a) re-fetches a batch forever when one
update in it fails to parse (the offset is never advanced: a poison pill), (b) backs off with
``asyncio.sleep`` (no injectable clock, no jitter) and (c) reports neither "lost" nor
"recovered" to its owner. Here each update is parsed on its own (a malformed one is logged
and skipped), the backoff is exponential with jitter on the injected clock, and ``state``
moves starting -> connected -> reconnecting -> connected, or -> failed on a rejected token.
"""

from __future__ import annotations

import asyncio
import random
import re
import warnings
from typing import Any

import structlog
from aiohttp import web
from telegram import Bot, ReactionTypeEmoji
from telegram.error import (
    BadRequest,
    Conflict,
    EndPointNotFound,
    InvalidToken,
    RetryAfter,
    TelegramError,
)
from telegram.request import HTTPXRequest
from telegram.warnings import PTBUserWarning

from channels.base import (
    ChannelState,
    DeliveryResult,
    EventHandler,
    InboundHandler,
    OutboundMessage,
)
from channels.reconnects import ConnectionCount
from channels.tasks import cancel_and_wait
from channels.telegram.actions import run_action
from channels.telegram.buttons import close_buttons, send_buttons
from channels.telegram.commands import register_commands
from channels.telegram.config import TelegramAccount
from channels.telegram.media import fetcher_for
from channels.telegram.normalize import BotIdentity
from channels.telegram.receive import dispatch_batch, dispatch_update, finish_batch
from channels.telegram.send import chat_id, retry_after_seconds, send_outbound, send_typing
from channels.telegram.stream import stream_for
from channels.telegram.webhook import handle_webhook
from runtime.clock import SYSTEM_CLOCK, Clock, utc_iso
from runtime.media.config import MediaSettings

log = structlog.get_logger(__name__)

# message_reaction is only delivered when asked for explicitly (Bot API: getUpdates).
ALLOWED_UPDATES = ["message", "edited_message", "channel_post", "edited_channel_post",
                   "message_reaction", "callback_query"]
_POLL_SLACK = 10.0  # seconds added to the long-poll timeout for the HTTP read timeout
START_WAIT = 15.0  # seconds start() waits for the first connection attempt
BATCH_WAIT = 10.0  # seconds stop() lets the update batch being handed over finish


class SetupRejected(Exception):
    """Telegram refused the configuration at start (e.g. setWebhook with a non-HTTPS
    url): retrying cannot help, so the account goes to state ``failed``."""


class TelegramChannel:
    """A Telegram bot account: ``Channel`` protocol of channels/base.py.

    ``backoff_initial`` / ``backoff_max`` (seconds) bound the reconnect delay, which doubles
    per failed attempt and is jittered to 50-100 %. Raises ValueError at construction for a
    missing token or a webhook mode without a valid ``webhook_secret``. ``media`` is part
    of the common adapter signature; albums are merged by the gateway, not here.
    """

    name = "telegram"

    def __init__(self, account_id: str, config: TelegramAccount, *,
                 clock: Clock = SYSTEM_CLOCK, backoff_initial: float = 1.0,
                 backoff_max: float = 30.0, media: MediaSettings | None = None) -> None:
        if not config.token:
            raise ValueError(f"channels.telegram account {account_id!r}: token: required")
        if config.mode == "webhook" and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}",
                                                         config.webhook_secret or ""):
            # Telegram's own rule for secret_token (setWebhook)
            raise ValueError(f"channels.telegram account {account_id!r}: webhook_secret: "
                             "required for mode webhook, 1-256 of A-Z a-z 0-9 _ -")
        self.account_id = account_id
        self.config = config
        self.state: ChannelState = "stopped" if config.enabled else "disabled"
        self._clock = clock
        self._backoff = (backoff_initial, backoff_max)
        self._token = config.token
        self._bot = self._build_bot()
        self._identity: BotIdentity | None = None
        self._on_message: InboundHandler | None = None
        self._on_event: EventHandler | None = None
        self._task: asyncio.Task | None = None
        self._first_attempt = asyncio.Event()
        self._offset: int | None = None
        # Replicas: where the getUpdates offset survives a takeover (load()/save(offset);
        # gateway/cluster/accounts.py). None: the offset lives in this process only.
        self.offset_store: Any = None
        self._batch: asyncio.Future | None = None  # the update batch being handed over
        self._last_error: str | None = None
        self._connected_since: float | None = None
        self._connects = ConnectionCount()
        self._log = log.bind(channel="telegram", account_id=account_id)
        self.on_press: Any = None  # the gateway's ButtonPress handler (channels/base.py)

    # ------------------------------------------------------------------ lifecycle
    def _build_bot(self) -> Bot:
        cfg = self.config
        send = HTTPXRequest(connection_pool_size=8, read_timeout=cfg.send_timeout,
                            write_timeout=cfg.send_timeout,
                            connect_timeout=min(10.0, cfg.send_timeout),
                            pool_timeout=cfg.send_timeout)
        poll = HTTPXRequest(connection_pool_size=1, read_timeout=cfg.poll_timeout + _POLL_SLACK,
                            connect_timeout=10.0, pool_timeout=5.0)
        file_url = cfg.api_file_url or cfg.api_base_url.replace("/bot", "/file/bot", 1)
        return Bot(self._token or "", base_url=cfg.api_base_url, base_file_url=file_url,
                   request=send, get_updates_request=poll)

    async def start(self, on_message: InboundHandler, on_event: EventHandler) -> None:
        """Connect (getMe, setMyCommands, deleteWebhook or setWebhook) and start polling.

        Returns after the first connection attempt, whatever its outcome, or after
        ``START_WAIT`` seconds (clock) if that attempt hangs: on network trouble the
        adapter keeps retrying in the background (state ``reconnecting``); a rejected token
        or webhook setup sets state ``failed``. Never raises for platform trouble. A second
        call while running is a no-op; after ``stop()`` it starts afresh.
        """
        if self.state == "disabled" or self._task is not None:
            return
        self._on_message, self._on_event = on_message, on_event
        # do_api_request("getUpdates") warns that Bot.get_updates exists; we want the raw
        # JSON on purpose (see module docstring).
        warnings.filterwarnings("ignore", message=r"Please use 'Bot\.getUpdates'",
                                category=PTBUserWarning)
        if self.offset_store is not None:
            self._offset = await self.offset_store.load()
        self.state = "starting"
        self._first_attempt = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"telegram:{self.account_id}")
        try:
            async with self._clock.timeout(START_WAIT):
                await self._first_attempt.wait()
        except TimeoutError:
            # e.g. a black-holed network: the first getMe is still waiting on its timeout
            self._log.warning("telegram_start_slow", waited_s=START_WAIT,
                              hint="still connecting in the background")

    async def stop(self) -> None:
        """Stop polling — an update batch being handed over is finished first, not cut
        off — confirm the processed offset, close HTTP clients. Idempotent."""
        task, self._task = self._task, None
        self._first_attempt.set()  # release a start() still waiting
        if task is not None:
            await cancel_and_wait(task)
            await finish_batch(self, BATCH_WAIT)
            if self.config.mode == "polling" and self._offset is not None:
                await self._confirm_offset()
        try:
            await self._bot.shutdown()
        except Exception as exc:  # noqa: BLE001 - shutdown is best effort
            self._log.debug("telegram_shutdown_error", error=self._redact(exc))
        if self.state != "disabled":
            self.state = "stopped"

    async def _confirm_offset(self) -> None:
        # The server drops updates below the offset only on the next getUpdates call.
        try:
            await self._raw_get_updates(timeout=0, limit=1, read_timeout=2.0)
        except Exception as exc:  # noqa: BLE001 - redelivery is harmless (gateway dedupes)
            self._log.debug("telegram_offset_confirm_failed", error=self._redact(exc))

    async def _run(self) -> None:
        try:
            await self._connect_loop()
        finally:
            self._first_attempt.set()

    async def _connect_loop(self) -> None:
        attempt = 0
        bootstrapped = False
        while True:
            try:
                if not bootstrapped:
                    await self._bootstrap()
                    bootstrapped = True
                    attempt = 0
                    self._mark_connected()
                if self.config.mode == "webhook":
                    await asyncio.Event().wait()  # updates arrive through http_routes()
                # After trouble a short poll proves the link at once: a long poll would
                # report success only when it returns (up to poll_timeout later), which
                # would hold back the outbox replies waiting for the reconnect.
                await self._poll_once(short=self.state == "reconnecting")
                if self.state != "connected":
                    attempt = 0
                    self._mark_connected()
            except asyncio.CancelledError:
                raise
            except (InvalidToken, EndPointNotFound) as exc:
                self.state = "failed"
                self._last_error = "token rejected by Telegram (401/404)"
                self._log.error("telegram_token_rejected", error=self._redact(exc),
                                hint="check the bot token (channels.telegram.token)")
                return
            except SetupRejected as exc:
                self.state = "failed"
                self._last_error = self._redact(exc)
                self._log.error("telegram_setup_rejected", error=self._last_error)
                return
            except Exception as exc:  # noqa: BLE001 - any trouble: back off and retry
                attempt += 1
                delay = self._delay(attempt, exc)
                self._last_error = self._redact(exc)
                if self.state != "reconnecting":
                    self._log.warning("telegram_connection_lost", error=self._last_error,
                                      error_type=type(exc).__name__,
                                      retry_in_s=round(delay, 3))
                else:
                    self._log.info("telegram_retrying", attempt=attempt,
                                   error=self._last_error, retry_in_s=round(delay, 3))
                self.state = "reconnecting"
                self._connected_since = None
                self._first_attempt.set()
                await self._clock.sleep(delay)

    def _delay(self, attempt: int, exc: BaseException) -> float:
        if isinstance(exc, RetryAfter):
            return retry_after_seconds(exc)
        initial, cap = self._backoff
        if isinstance(exc, Conflict):
            # Another poller or a webhook: retrying fast only fights it.
            initial = max(initial, 5.0)
        base = min(cap, initial * 2 ** (attempt - 1))
        return base * random.uniform(0.5, 1.0)

    def _mark_connected(self) -> None:
        self.state = "connected"
        self._connects.connected()
        self._last_error = None
        self._connected_since = self._clock.time()
        self._log.info("telegram_connected", mode=self.config.mode,
                       bot_username=self._identity.username if self._identity else None)
        self._first_attempt.set()

    async def _bootstrap(self) -> None:
        await self._bot.initialize()  # getMe; raises InvalidToken on 401/404
        me = self._bot.bot
        self._identity = BotIdentity(id=me.id, username=me.username or "")
        try:
            await register_commands(self._bot)
        except TelegramError as exc:
            # Commands still work when typed; the menu is a convenience: a refusal (a 429
            # flood wait, 403) must not cost the connection.
            self._log.warning("telegram_set_commands_failed", error=self._redact(exc))
        if self.config.mode == "polling":
            await self._bot.delete_webhook(drop_pending_updates=False)
        elif self.config.webhook_url:
            try:
                await self._bot.set_webhook(url=self.config.webhook_url,
                                            secret_token=self.config.webhook_secret,
                                            allowed_updates=ALLOWED_UPDATES)
            except BadRequest as exc:
                raise SetupRejected(f"setWebhook refused: {exc}") from exc
        else:
            self._log.info("telegram_webhook_external", path=self.config.webhook_path,
                           hint="webhook_url not set: setWebhook is left to the operator")

    # ------------------------------------------------------------------ inbound
    async def _raw_get_updates(self, *, timeout: float, limit: int = 100,
                               read_timeout: float | None = None) -> Any:
        kwargs: dict[str, Any] = {"timeout": int(timeout), "limit": limit,
                                  "allowed_updates": ALLOWED_UPDATES}
        if self._offset is not None:
            kwargs["offset"] = self._offset
        # Raw JSON so that every update is parsed on its own (see module docstring).
        return await self._bot.do_api_request(
            "getUpdates", api_kwargs=kwargs,
            read_timeout=read_timeout if read_timeout is not None else timeout + _POLL_SLACK)

    async def _poll_once(self, *, short: bool = False) -> None:
        # Long polls of at least 1 s: timeout 0 is short polling, a busy loop against the
        # API; ``short`` is one such call, made once per reconnect.
        timeout = 0.0 if short else max(1.0, self.config.poll_timeout)
        result = await self._raw_get_updates(timeout=timeout)
        if not isinstance(result, list):
            self._log.warning("telegram_update_malformed",
                              reason="getUpdates result is not a list")
            return
        self._batch = asyncio.ensure_future(dispatch_batch(self, result))
        await asyncio.shield(self._batch)  # stop() lets it finish (receive.py)

    async def dispatch(self, raw: Any) -> None:
        """Normalise one raw update (JSON dict) and hand it to the gateway callbacks
        (channels/telegram/receive.py). Used by the poll loop and the webhook route."""
        await dispatch_update(self, raw)

    def http_routes(self) -> list[web.RouteDef]:
        """Webhook mode: ``POST <webhook_path>`` for the gateway's aiohttp app; [] when
        polling. The route answers 403 unless ``X-Telegram-Bot-Api-Secret-Token`` equals
        ``webhook_secret`` (constant-time compare), 503 before the adapter is connected
        (Telegram retries), 400 for a body that is not JSON, else 200."""
        if self.config.mode != "webhook":
            return []
        return [web.post(self.config.webhook_path,
                         lambda request: handle_webhook(self, request))]

    def connected_for_webhook(self) -> bool:
        return self._identity is not None and self._task is not None

    def media_fetch(self, handle: str, name: str) -> Any:
        """A download for a file by its ``file_id`` (``InboundMedia.handle``): how a
        journaled album part that was not downloaded before a restart is fetched after
        it (gateway/inbound/albums.py)."""
        return fetcher_for(self._bot, handle, name)

    # ------------------------------------------------------------------ outbound
    async def act(self, action: str, route: Any, args: dict[str, Any]) -> str:
        """A channel tool's action in the route's chat (channels/telegram/actions.py).
        Raises RuntimeError when not running or Telegram refuses."""
        if self._task is None or self.state == "failed":
            raise RuntimeError("telegram adapter not running")
        return await run_action(self._bot, action, route.to, args)

    async def send_buttons(self, to: str, text: str, buttons: list[Any]) -> str:
        """channels/base.py ``ButtonChannel`` (channels/telegram/buttons.py)."""
        if self._task is None or self.state == "failed":
            raise RuntimeError("telegram adapter not running")
        return await send_buttons(self._bot, to, text, buttons)

    async def close_buttons(self, to: str, message_id: str, text: str) -> None:
        await close_buttons(self._bot, to, message_id, text)

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        """Send ``message.text`` (model Markdown) as Telegram-HTML parts of <= 4096 UTF-16
        units into ``message.to`` / forum topic ``thread_id``; the first part replies to
        ``reply_to``. Markup rejected -> that part is resent plain; 429 -> waits
        ``retry_after`` (clock) and retries; network/5xx -> ok=False, retryable=True
        (channels/telegram/send.py)."""
        if self.state == "failed":
            return DeliveryResult(ok=False, error=f"telegram: {self._last_error}",
                                  retryable=False)
        if self._task is None:
            return DeliveryResult(ok=False, error="telegram adapter not running",
                                  retryable=True)
        return await send_outbound(self._bot, message, clock=self._clock, log=self._log)

    async def react(self, to: str, thread_id: str | None, message_id: str, emoji: str, *,
                    remove: bool = False) -> None:
        """``setMessageReaction`` on ``message_id`` in chat ``to``: set ``emoji`` as the
        bot's reaction, or clear the bot's reactions (``remove``). Raises on failure."""
        reaction = [] if remove else [ReactionTypeEmoji(emoji)]
        await self._bot.set_message_reaction(chat_id(to), int(message_id), reaction)

    def stream_sender(self, message: OutboundMessage, chat_type: str, *,
                      mode: str = "partial", recipient: str | None = None) -> Any:
        """A sender for one streamed reply (channels/telegram/stream.py: drafts in private
        chats, else send + edit); None while the adapter is not running."""
        if self._task is None or self.state == "failed":
            return None
        return stream_for(self._bot, message, private=chat_type == "dm")

    async def typing(self, to: str, thread_id: str | None = None) -> None:
        """One ``sendChatAction typing`` into the chat/topic; failures logged at debug."""
        if self._task is not None:
            await send_typing(self._bot, to, thread_id, log=self._log)

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        """``{state, account_id, bot_id, bot_username, last_error, connected_since, mode}``
        (connected_since as RFC 3339 UTC or None)."""
        ident = self._identity
        return {"state": self.state, "account_id": self.account_id,
                "bot_id": str(ident.id) if ident else None,
                "bot_username": ident.username if ident else None,
                "last_error": self._last_error,
                "connected_since": utc_iso(self._connected_since)
                if self._connected_since is not None else None,
                "mode": self.config.mode, "reconnects": self._connects.reconnects}

    def _redact(self, exc: BaseException | str) -> str:
        """Error text without the bot token (PTB puts it into InvalidToken messages)."""
        text = str(exc)
        return text.replace(self._token, "<token>") if self._token else text
