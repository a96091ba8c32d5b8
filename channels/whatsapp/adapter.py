"""The WhatsApp channel adapter (WhatsApp Cloud API: Graph API out, webhooks in).

One ``WhatsAppChannel`` per configured phone number (``channels.whatsapp`` /
``channels.whatsapp.accounts.<id>``, channels/whatsapp/config.py). Inbound traffic arrives
only through the webhook routes it mounts on the gateway's HTTP server
(channels/whatsapp/webhook.py, channels/whatsapp/receive.py); replies go out through the
Graph API (channels/whatsapp/send.py). There is no long-lived connection: ``state`` is
``connected`` once ``GET /{phone-number-id}`` has proved the token and the id, ``failed``
when Meta rejected the token (error 190 / HTTP 401), ``reconnecting`` (retried with
backoff on the injected clock) while the Graph API cannot be reached: at start, or after
a send got a 5xx or no connection (it is then probed until it answers, and the outbox is
flushed as soon as it is back).

No streaming: the Cloud API cannot edit a sent message, so a reply is sent once it is
complete (long replies in parts of at most 4096 characters).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import structlog
from aiohttp import web

from channels.base import (
    ChannelState,
    DeliveryResult,
    EventHandler,
    InboundHandler,
    OutboundMessage,
)
from channels.reconnects import ConnectionCount
from channels.tasks import cancel_and_wait
from channels.whatsapp.config import WhatsAppAccount
from channels.whatsapp.graph import GraphClient, GraphError
from channels.whatsapp.receive import Recent, dispatch
from channels.whatsapp.send import outside_window, send_outbound
from channels.whatsapp.webhook import handle_post, handle_verify
from channels.whatsapp.window import CustomerWindows
from runtime.clock import SYSTEM_CLOCK, Clock, utc_iso
from runtime.media.config import MediaSettings

log = structlog.get_logger(__name__)

START_WAIT = 15.0  # seconds start() waits for the first check of the phone number
TYPING_EVERY = 20.0  # seconds: WhatsApp shows the indicator for up to 25 s
INBOUND_USERS = 10_000  # users whose latest message id is kept (oldest forgotten)


class WhatsAppChannel:
    """A WhatsApp Business phone number: ``Channel`` protocol of channels/base.py.

    ``windows_document``: where the 24-hour windows persist (a read/write/keep_aside
    store, channels/whatsapp/window.py; None: memory only). Raises ValueError at
    construction for a missing ``access_token``, ``phone_number_id``, ``app_secret`` or
    ``verify_token``."""

    name = "whatsapp"
    webhook_only = True  # replicas: runs on every one, the load balancer picks (no lease)

    def __init__(self, account_id: str, config: WhatsAppAccount, *,
                 clock: Clock = SYSTEM_CLOCK, media: MediaSettings | None = None,
                 windows_document: Any = None, problems: list[str] | None = None,
                 backoff_initial: float = 1.0, backoff_max: float = 60.0) -> None:
        for key in ("access_token", "phone_number_id", "app_secret", "verify_token"):
            if not getattr(config, key):
                raise ValueError(f"channels.whatsapp account {account_id!r}: {key}: required")
        self.account_id = account_id
        self.config = config
        self.state: ChannelState = "stopped" if config.enabled else "disabled"
        self._clock = clock
        self._backoff = (backoff_initial, backoff_max)
        self.graph = GraphClient(base_url=config.api_base_url, version=config.api_version,
                                 phone_number_id=str(config.phone_number_id),
                                 token=config.access_token or "",
                                 timeout=config.send_timeout)
        self.windows = CustomerWindows(windows_document, clock, hours=config.window_hours,
                                       problems=problems)
        self.seen = Recent()
        self._on_message: InboundHandler | None = None
        self._on_event: EventHandler | None = None
        self._task: asyncio.Task | None = None
        self._first_attempt = asyncio.Event()
        self._trouble = asyncio.Event()
        self._trouble_reason = ""
        self._number: dict[str, Any] = {}
        self._last_error: str | None = None
        self._connected_since: float | None = None
        self._connects = ConnectionCount()
        self._inbound: dict[str, str] = {}  # wa_id -> their latest message id
        self._typed: dict[str, float] = {}  # message id -> when the indicator was sent
        self._failed = 0
        self._last_delivery_error: str | None = None
        self._tasks: set[asyncio.Task] = set()
        self._log = log.bind(channel="whatsapp", account_id=account_id)

    # ------------------------------------------------------------------ lifecycle
    async def start(self, on_message: InboundHandler, on_event: EventHandler) -> None:
        """Check the phone number (``GET /{phone-number-id}``) and accept webhooks.
        Returns after the first check, whatever its outcome, or after ``START_WAIT``
        seconds (clock); never raises for platform trouble. A second call while running
        is a no-op."""
        if self.state == "disabled" or self._task is not None:
            return
        self._on_message, self._on_event = on_message, on_event
        self.state = "starting"
        self._first_attempt = asyncio.Event()
        self._task = asyncio.create_task(self._connect_loop(), name=f"whatsapp:{self.account_id}")
        try:
            async with self._clock.timeout(START_WAIT):
                await self._first_attempt.wait()
        except TimeoutError:
            self._log.warning("whatsapp_start_slow", waited_s=START_WAIT,
                              hint="still checking the phone number in the background")

    async def stop(self) -> None:
        """Stop accepting webhooks (503, Meta redelivers later), close the HTTP client.
        Idempotent."""
        task, self._task = self._task, None
        self._first_attempt.set()
        await cancel_and_wait(task)
        for pending in list(self._tasks):  # read receipts, a template after a failure
            pending.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.graph.close()
        if self.state != "disabled":
            self.state = "stopped"

    async def _connect_loop(self) -> None:
        attempt = 0
        try:
            while True:
                try:
                    self._number = await self.graph.phone_number()
                    attempt = 0
                    self._mark_connected()
                    self._trouble.clear()
                    await self._trouble.wait()  # a send found the Graph API down
                    attempt = await self._retry(attempt, self._trouble_reason)
                except asyncio.CancelledError:
                    raise
                except GraphError as exc:
                    if exc.token_rejected:
                        self.state, self._last_error = "failed", str(exc)
                        self._log.error("whatsapp_token_rejected", error=str(exc),
                                        hint="check channels.whatsapp.access_token")
                        return
                    attempt = await self._retry(attempt, str(exc))
                except Exception as exc:  # noqa: BLE001 - network trouble: back off, retry
                    attempt = await self._retry(attempt, f"{type(exc).__name__}: {exc}")
        finally:
            self._first_attempt.set()

    def _unreachable(self, error: str) -> None:
        """A send got a 5xx or no connection: probe the Graph API until it answers, so
        ``state`` shows the outage and the outbox is flushed as soon as it is over."""
        if self.state == "connected":
            self._trouble_reason = error
            self._trouble.set()

    async def _retry(self, attempt: int, error: str) -> int:
        attempt += 1
        initial, cap = self._backoff
        delay = min(cap, initial * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        self._last_error = error
        self._log.warning("whatsapp_graph_unreachable", error=error, attempt=attempt,
                          retry_in_s=round(delay, 3))
        self.state, self._connected_since = "reconnecting", None
        self._first_attempt.set()
        await self._clock.sleep(delay)
        return attempt

    def _mark_connected(self) -> None:
        self.state, self._last_error = "connected", None
        self._connects.connected()
        self._connected_since = self._clock.time()
        self._log.info("whatsapp_connected", phone=self._number.get("display_phone_number"),
                       verified_name=self._number.get("verified_name"))
        self._first_attempt.set()

    # ------------------------------------------------------------------ inbound
    def http_routes(self) -> list[web.RouteDef]:
        """``GET`` and ``POST`` ``<webhook_path>`` for the gateway's aiohttp app
        (channels/whatsapp/webhook.py)."""
        async def verify(request: web.Request) -> web.Response:
            return await handle_verify(self, request)

        async def notify(request: web.Request) -> web.Response:
            return await handle_post(self, request)
        verify.__doc__, notify.__doc__ = handle_verify.__doc__, handle_post.__doc__
        path = self.config.webhook_path
        return [web.get(path, verify, allow_head=False), web.post(path, notify)]

    def ready_for_webhook(self) -> bool:
        """Started and not ``failed``: with a rejected token no reply could go out, so
        notifications are answered 503 and Meta keeps them (it retries for days) until
        the token is fixed."""
        return self._task is not None and self._on_message is not None \
            and self.state != "failed"

    async def dispatch(self, payload: Any) -> list[str]:
        """One verified webhook body to the gateway (channels/whatsapp/receive.py)."""
        return await dispatch(self, payload)

    def media_fetch(self, handle: str, name: str) -> Any:
        """``fetch(max_bytes)`` for an inbound file by its media id (also how a journaled
        file is fetched again after a restart: media ids stay valid for 30 days)."""
        async def fetch(max_bytes: int) -> bytes:
            return await self.graph.download(handle, name=name, max_bytes=max_bytes)
        return fetch

    def note_inbound(self, wa_id: str, message_id: str) -> str | None:
        """``message_id`` is ``wa_id``'s latest (for the typing indicator); returns the
        one it replaces (for :meth:`forget_inbound`). At most INBOUND_USERS are kept."""
        if not message_id:
            return None
        before = self._inbound.pop(wa_id, None)
        self._inbound[wa_id] = message_id
        while len(self._inbound) > INBOUND_USERS:
            self._inbound.pop(next(iter(self._inbound)))
        return before

    def forget_inbound(self, wa_id: str, before: str | None) -> None:
        """Undo :meth:`note_inbound` for a sender the access policy refused."""
        self._inbound.pop(wa_id, None)
        if before is not None:
            self._inbound[wa_id] = before

    def mark_read_later(self, message_id: str) -> None:
        """With ``read_receipts``: mark an accepted message read (in the background)."""
        if message_id and self.config.read_receipts and self._task is not None:
            self._spawn(self._mark_read(message_id, typing=False))

    def note_failed_delivery(self, message_id: str, to: str, error: str) -> None:
        self._failed += 1
        self._last_delivery_error = f"{message_id} to {to}: {error}"

    async def window_closed_after_send(self, to: str) -> None:
        """Meta reported a sent message failed with 131047: send the window template
        now (once until the user writes again) or log the refusal."""
        await outside_window(self.graph, to, [], windows=self.windows,
                             template=self.config.window_template, log=self._log)

    # ------------------------------------------------------------------ outbound
    async def send(self, message: OutboundMessage) -> DeliveryResult:
        """Send ``message.text`` (model Markdown, WhatsApp formatting) in parts of <= 4096
        characters and ``message.media`` as uploads to the user ``message.to``; outside
        the 24-hour window the window template or a refusal instead
        (channels/whatsapp/send.py)."""
        if self.state == "failed":
            return DeliveryResult(ok=False, error=f"whatsapp: {self._last_error}",
                                  retryable=False)
        if self._task is None:
            return DeliveryResult(ok=False, error="whatsapp adapter not running",
                                  retryable=True)
        return await send_outbound(self.graph, message, windows=self.windows,
                                   template=self.config.window_template, clock=self._clock,
                                   log=self._log, unreachable=self._unreachable)

    async def react(self, to: str, thread_id: str | None, message_id: str, emoji: str, *,
                    remove: bool = False) -> None:
        """Set ``emoji`` as the business's reaction on ``message_id`` (or clear it with
        ``remove``). Raises GraphError / aiohttp errors on failure."""
        await self.graph.send({"to": to, "type": "reaction", "reaction": {
            "message_id": message_id, "emoji": "" if remove else emoji}})

    async def typing(self, to: str, thread_id: str | None = None) -> None:
        """With ``read_receipts``: mark the user's latest message read and show the typing
        indicator (at most every 20 s per message); otherwise nothing (WhatsApp has no
        indicator without a read receipt)."""
        mid = self._inbound.get(to)
        if not self.config.read_receipts or not mid or self._task is None:
            return
        now = self._clock.monotonic()
        if now - self._typed.get(mid, -TYPING_EVERY) < TYPING_EVERY:
            return
        self._typed[mid] = now
        if len(self._typed) > 1000:
            self._typed.pop(next(iter(self._typed)))
        await self._mark_read(mid, typing=True)

    async def _mark_read(self, message_id: str, *, typing: bool) -> None:
        try:
            await self.graph.mark_read(message_id, typing=typing)
        except Exception as exc:  # noqa: BLE001 - read receipts are cosmetic
            self._log.debug("whatsapp_mark_read_failed", message_id=message_id,
                            error=f"{type(exc).__name__}: {exc}")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        """``{state, account_id, phone_number_id, display_phone_number, verified_name,
        last_error, connected_since, reconnects, failed_deliveries,
        last_delivery_error}`` (connected_since as RFC 3339 UTC or None)."""
        return {"state": self.state, "account_id": self.account_id,
                "phone_number_id": self.config.phone_number_id,
                "display_phone_number": self._number.get("display_phone_number"),
                "verified_name": self._number.get("verified_name"),
                "last_error": self._last_error,
                "connected_since": utc_iso(self._connected_since)
                if self._connected_since is not None else None,
                "reconnects": self._connects.reconnects,
                "failed_deliveries": self._failed,
                "last_delivery_error": self._last_delivery_error}
