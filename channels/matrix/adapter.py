"""The Matrix channel adapter (matrix-nio, client-server API): ``/sync`` long polls in,
room events out.

One ``MatrixChannel`` per configured account (``channels.matrix`` /
``channels.matrix.accounts.<id>``, model channels/matrix/config.py ``MatrixAccount``). It
implements the ``Channel`` protocol of channels/base.py: sync responses become
``InboundMessage``/``ChannelEvent`` (channels/matrix/receive.py, normalize.py); replies are
rendered to HTML and sent as ``m.text`` events (channels/matrix/send.py), streamed replies
are edited in place with ``m.replace`` (stream.py), acknowledgement reactions are
``m.reaction`` annotations, files go up and down through the media API (media.py).

The sync loop is driven here, one ``sync`` call at a time, rather than by nio's
``sync_forever``: the sync token is saved only after every event of a response was handed
over (channels/matrix/sync_state.py: no replay, no gap across restarts), a failure backs
off exponentially with jitter on the injected clock (nio would sleep on the real clock
and retry forever: its own retries are turned off), and ``state`` moves starting ->
connected -> reconnecting -> connected, or -> failed when the homeserver rejects the
credentials (``M_UNKNOWN_TOKEN``, ``M_FORBIDDEN`` at login). End-to-end encryption is not
implemented: encrypted rooms are not readable to this adapter.
"""

from __future__ import annotations

import asyncio
import random
from collections import OrderedDict
from contextlib import suppress
from typing import Any

import structlog

from channels.base import (
    ChannelState,
    DeliveryResult,
    EventHandler,
    InboundHandler,
    OutboundMessage,
)
from channels.matrix.config import MatrixAccount
from channels.matrix.media import fetcher_for
from channels.matrix.normalize import BotIdentity
from channels.matrix.receive import MatrixReceiving
from channels.matrix.send import put_event, refusal, send_outbound
from channels.matrix.stream import MatrixStream
from channels.matrix.sync_state import SyncState
from channels.reconnects import ConnectionCount
from channels.tasks import cancel_and_wait
from runtime.clock import SYSTEM_CLOCK, Clock, maybe_timeout, utc_iso

log = structlog.get_logger(__name__)

START_WAIT = 15.0  # seconds start() waits for the first sync
FATAL_CODES = {"M_UNKNOWN_TOKEN": "access token rejected by the homeserver (M_UNKNOWN_TOKEN)",
               "M_FORBIDDEN": "login refused by the homeserver (M_FORBIDDEN: wrong password?)",
               "M_USER_DEACTIVATED": "the bot user is deactivated"}
_SENT_KEEP = 4096  # event ids of the bot's own messages remembered (replies = mentions)


class CredentialsRejected(Exception):
    """The homeserver refused the login or the token: retrying cannot help."""


class BoundedSet:
    """A set that forgets its oldest members past ``size``."""

    def __init__(self, size: int) -> None:
        self.size, self._d = size, OrderedDict()

    def add(self, item: str) -> None:
        self._d[item] = None
        self._d.move_to_end(item)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def __contains__(self, item: object) -> bool:
        return item in self._d


class MatrixChannel(MatrixReceiving):
    """One Matrix bot account. See the module docstring for lifecycle and failure modes.

    ``backoff_initial``/``backoff_max`` (seconds, both capped by ``reconnect_max``) bound
    the reconnect delay (doubling, jittered to 50-100 %). ``state_store``: where the sync position lives (a document
    store: ``ChannelContext.document``; None = memory only). Raises ValueError when the account has no
    homeserver, user id, or credentials."""

    name = "matrix"

    def __init__(self, account_id: str, config: MatrixAccount, *, clock: Clock = SYSTEM_CLOCK,
                 backoff_initial: float = 1.0, backoff_max: float = 30.0, media: Any = None,
                 state_store: Any = None) -> None:
        if not config.homeserver or not config.user_id or not (
                config.access_token or config.password):
            raise ValueError(f"channels.matrix.accounts.{account_id}: homeserver, user_id "
                             "and access_token (or password) are required")
        self.account_id, self.config, self._config = account_id, config, config
        self.state: ChannelState = "stopped" if config.enabled else "disabled"
        self._clock = clock
        self._backoff = (min(backoff_initial, config.reconnect_max),
                         min(backoff_max, config.reconnect_max))
        self._state = SyncState(state_store)
        self._identity = BotIdentity(config.user_id)
        self._client: Any = None
        self._task: asyncio.Task | None = None
        self._first = asyncio.Event()
        self._on_message: InboundHandler | None = None
        self._on_event: EventHandler | None = None
        self._sent = BoundedSet(_SENT_KEEP)
        self._reactions: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._last_error: str | None = None
        self._connected_since: float | None = None
        self._connects = ConnectionCount()
        self._rng = random.Random()
        self.on_press: Any = None

    # ------------------------------------------------------------------ lifecycle
    def _new_client(self) -> Any:
        from nio import AsyncClient, AsyncClientConfig
        cfg = AsyncClientConfig(max_limit_exceeded=0, max_timeouts=0,
                                request_timeout=self.config.send_timeout,
                                encryption_enabled=False, store_sync_tokens=False)
        return AsyncClient(self.config.homeserver.rstrip("/"), self.config.user_id,
                           device_id=self.config.device_id, config=cfg)

    async def start(self, on_message: InboundHandler, on_event: EventHandler) -> None:
        """Log in and start the sync loop; returns after the first sync (or its failure,
        or START_WAIT seconds on the clock). Never raises for platform trouble."""
        if self.state == "disabled" or self._task is not None:
            return
        self._on_message, self._on_event = on_message, on_event
        await asyncio.to_thread(self._state.load)
        self._client = self._new_client()
        self.state = "starting"
        self._first = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"matrix:{self.account_id}")
        with suppress(TimeoutError):
            async with maybe_timeout(self._clock, START_WAIT):
                await self._first.wait()

    async def stop(self) -> None:
        """Stop syncing and close the HTTP session; idempotent."""
        task, self._task = self._task, None
        self._first.set()
        await cancel_and_wait(task)
        if self._client is not None:
            with suppress(Exception):
                await self._client.close()
        if self.state != "disabled":
            self.state = "stopped"

    async def _run(self) -> None:
        attempt = 0
        logged_in = False
        while True:
            try:
                if not logged_in:
                    await self._login()
                    logged_in = True
                await self._sync_once(short=self.state != "connected")
                if self.state != "connected":
                    self._mark_connected()
                attempt = 0
            except asyncio.CancelledError:
                raise
            except CredentialsRejected as exc:
                self.state, self._last_error = "failed", str(exc)
                log.error("matrix_login_rejected", account_id=self.account_id,
                          error=str(exc), hint="check channels.matrix access_token/password")
                self._first.set()
                return
            except Exception as exc:  # noqa: BLE001 - any trouble: back off and retry
                attempt += 1
                await self._lost(exc, attempt)

    async def _lost(self, exc: BaseException, attempt: int) -> None:
        delay = min(self._backoff[1], self._backoff[0] * 2 ** min(attempt - 1, 16))
        delay *= 0.5 + self._rng.random() / 2
        self._last_error = self._redact(f"{type(exc).__name__}: {exc}")
        event = "matrix_connection_lost" if self.state != "reconnecting" else "matrix_retrying"
        log.warning(event, account_id=self.account_id, error=self._last_error,
                    attempt=attempt, retry_in_s=round(delay, 3))
        self.state = "reconnecting"
        self._connected_since = None
        self._first.set()
        await self._clock.sleep(delay)

    def _mark_connected(self) -> None:
        self.state = "connected"
        self._connects.connected()
        self._last_error = None
        self._connected_since = self._clock.time()
        log.info("matrix_connected", account_id=self.account_id,
                 user_id=self._identity.user_id)
        self._first.set()

    async def _login(self) -> None:
        from nio import LoginResponse, ProfileGetDisplayNameResponse, WhoamiResponse
        client, cfg = self._client, self.config
        if cfg.access_token:
            client.access_token = cfg.access_token.strip()
            resp = await client.whoami()
            if not isinstance(resp, WhoamiResponse):
                raise self._login_error(resp)
            client.user_id = resp.user_id
        else:
            resp = await client.login(cfg.password, device_name="tidegate")
            if not isinstance(resp, LoginResponse):
                raise self._login_error(resp)
        name = await client.get_displayname(client.user_id)
        display = name.displayname if isinstance(name, ProfileGetDisplayNameResponse) else None
        self._identity = BotIdentity(client.user_id, display)

    def _login_error(self, resp: Any) -> Exception:
        code = getattr(resp, "status_code", None)
        if code in FATAL_CODES:
            return CredentialsRejected(FATAL_CODES[code])
        return ConnectionError(f"login failed: {self._redact(str(resp))}")

    def _filter(self) -> dict[str, Any]:
        return {"room": {"timeline": {"limit": self.config.timeline_limit},
                         "state": {"lazy_load_members": True},
                         "ephemeral": {"not_types": ["*"]}},
                "presence": {"not_types": ["*"]}}

    async def _sync_once(self, *, short: bool) -> None:
        """One /sync from the saved token; its events handed over, then the new token
        saved. ``short``: no long-poll wait (proves the link at once after trouble)."""
        from nio import SyncResponse
        since = self._state.next_batch
        wait = 0 if short or since is None else int(self.config.sync_timeout * 1000)
        resp = await self._client.sync(timeout=wait, sync_filter=self._filter(), since=since)
        if not isinstance(resp, SyncResponse):
            if getattr(resp, "status_code", None) in FATAL_CODES:
                raise CredentialsRejected(FATAL_CODES[resp.status_code])
            raise ConnectionError(f"sync failed: {self._redact(str(resp))}")
        await self._handle_sync(resp, since=since)
        await asyncio.to_thread(self._state.save, resp.next_batch)

    # ------------------------------------------------------------------ outbound
    def _fetcher(self, mxc: str, name: str) -> Any:
        return fetcher_for(self.config.homeserver or "", self._client.access_token or "",
                           mxc, name, timeout=self.config.send_timeout)

    def media_fetch(self, handle: str, name: str) -> Any:
        """A download of ``mxc://`` ``handle`` (after a restart: gateway/inbound/albums)."""
        return self._fetcher(handle, name)

    def _ready(self) -> bool:
        return self._task is not None and self.state != "failed" and \
            self._client is not None and bool(self._client.access_token)

    async def _room_for(self, to: str) -> str:
        """The room of a route's ``to``: a room id as is; a user id -> the DM room with
        that user (created, with an invite, when there is none). Raises DeliveryError."""
        if not to.startswith("@"):
            return to
        known = self._state.room_of(to)
        if known:
            return known
        from nio import RoomCreateResponse
        resp = await self._client.room_create(is_direct=True, invite=[to])
        if not isinstance(resp, RoomCreateResponse):
            raise refusal(resp)
        self._state.add_direct(resp.room_id, to)
        log.info("matrix_dm_created", account_id=self.account_id, room_id=resp.room_id,
                 user_id=to)
        return resp.room_id

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        """Send ``message`` (HTML-rendered parts, then files) into room ``message.to``
        (or the DM with user ``message.to``); see channels/matrix/send.py."""
        if self.state == "failed":
            return DeliveryResult(ok=False, error=f"matrix: {self._last_error}")
        if not self._ready():
            return DeliveryResult(ok=False, error="matrix adapter not running",
                                  retryable=True)
        try:
            room = await self._room_for(message.to)
            result = await send_outbound(self._client, room, message, clock=self._clock)
        except Exception as exc:  # noqa: BLE001 - reported like any failed send
            from channels.outbound.delivery import is_retryable
            return DeliveryResult(ok=False, error=f"{type(exc).__name__}: {exc}",
                                  retryable=is_retryable(exc))
        for event_id in result.message_ids:
            self._sent.add(event_id)
        return result

    async def resend_unknown(self, message: OutboundMessage, since: float) -> DeliveryResult:
        """Send again a reply whose earlier send may have arrived: the same
        ``idempotency_key`` gives the same transaction ids, which the homeserver
        answers with the events it already has instead of new ones."""
        return await self.send(message)

    def stream_sender(self, message: OutboundMessage, chat_type: str, *,
                      mode: str = "partial", recipient: str | None = None) -> Any:
        """An ``m.replace`` editing stream (channels/matrix/stream.py); None while not
        running or when the DM room of a user is not known yet."""
        room = message.to if not message.to.startswith("@") else \
            self._state.room_of(message.to)
        if not self._ready() or not room:
            return None
        return MatrixStream(self._client, room, message, on_sent=self._sent.add)

    async def react(self, to: str, thread_id: str | None, message_id: str, emoji: str, *,
                    remove: bool = False) -> None:
        """Add the ``emoji`` reaction (``m.annotation``) to ``message_id``, or redact the
        one the bot added (``remove``). Raises on failure."""
        room = await self._room_for(to)
        if remove:
            event_id = self._reactions.pop((message_id, emoji), None)
            if event_id is not None:
                await self._client.room_redact(room, event_id)
            return
        content = {"m.relates_to": {"rel_type": "m.annotation", "event_id": message_id,
                                    "key": emoji}}
        self._reactions[(message_id, emoji)] = await put_event(
            self._client, room, "m.reaction", content)
        while len(self._reactions) > _SENT_KEEP:
            self._reactions.popitem(last=False)

    async def typing(self, to: str, thread_id: str | None = None) -> None:
        """One typing notice (``PUT /rooms/{room}/typing``, 10 s); failures at debug."""
        if not self._ready():
            return
        try:
            room = await self._room_for(to)
            await self._client.room_typing(room, True, timeout=10_000)
        except Exception as exc:  # noqa: BLE001 - typing is cosmetic
            log.debug("matrix_typing_failed", account_id=self.account_id, error=str(exc))

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        """``{state, account_id, user_id, last_error, connected_since, reconnects}``
        (connected_since RFC 3339 UTC or None)."""
        return {"state": self.state, "account_id": self.account_id,
                "bot_id": self._identity.user_id, "bot_username": self._identity.display_name,
                "last_error": self._last_error,
                "connected_since": utc_iso(self._connected_since)
                if self._connected_since is not None else None,
                "reconnects": self._connects.reconnects}

    def _redact(self, text: str) -> str:
        for secret in (self.config.access_token, self.config.password,
                       getattr(self._client, "access_token", None)):
            if secret:
                text = text.replace(secret, "***")
        return text
