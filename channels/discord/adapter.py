"""Discord channel adapter (discord.py 2.x): gateway WebSocket in, REST messages out.

One ``DiscordChannel`` per configured account (``channels.discord`` / ``accounts.<id>``,
model ``channels.config.DiscordAccount``). It implements the ``Channel`` protocol of
``channels/base.py``: platform events become ``InboundMessage``/``ChannelEvent`` (see
``channels/discord/inbound.py``), replies are rendered with ``render_chunks(..., "discord")``
and sent with ``send_chunks`` (``channels/outbound/delivery.py``). This module holds the lifecycle
and connection supervision; the event handlers live in channels/discord/receive.py and the
outbound methods in channels/discord/outbound.py.

Connection supervision (issue 3): ``discord.Client.connect(reconnect=False)`` runs in a
background task; when it ends for any reason other than ``stop()`` the client is closed and
a fresh one logs in again after an exponential backoff with jitter, slept on the injected
clock (discord.py's own reconnect backoff sleeps on the real clock, up to 1024 s). Gateway
parsers are wrapped so one unparseable event is logged and skipped instead of ending
``connect()`` (TESTING.md). Fatal conditions set state ``failed`` and stop retrying: HTTP 401
on login / close 4004 (bad token), 4014 (message content intent not enabled in the portal),
4010-4013 (sharding/version/intents misconfiguration).

REST and gateway endpoints are process-wide class attributes in discord.py
(``discord.http.Route.BASE``, ``DiscordWebSocket.DEFAULT_GATEWAY``); ``start`` sets them from
the account config, so all Discord accounts of one process must share them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import discord
import structlog

from channels.base import (
    ChannelState,
    EventHandler,
    InboundHandler,
)
from channels.discord.buttons import close_buttons, press_of, send_buttons
from channels.discord.catchup import ChannelCursors, catch_up
from channels.discord.client import (
    FATAL_CLOSE_CODES,
    LOGIN_REJECTED,
    Bounded,
    configure_endpoints,
    guard_parsers,
    new_client,
)
from channels.discord.commands import TOKEN_TTL, build_tree, sync_commands
from channels.discord.config import DiscordAccount
from channels.discord.outbound import DiscordSending
from channels.discord.receive import DiscordReceiving
from channels.discord.resume import (
    ResumeFile,
    SessionTracker,
    close_resumable,
    run_gateway,
    track_parsers,
)
from channels.discord.threads import ReplyThreads
from channels.inbound.command_replies import CommandReplies
from channels.reconnects import ConnectionCount
from channels.tasks import cancel_and_wait
from runtime.clock import SYSTEM_CLOCK, Clock, maybe_timeout, utc_iso

log = structlog.get_logger(__name__)

_RAW_KEEP = 256  # raw MESSAGE_CREATE payloads kept until on_message picks them up
_DM_KEEP = 4096  # user id <-> DM channel id pairs remembered


class DiscordChannel(DiscordReceiving, DiscordSending):
    """One Discord bot account. See the module docstring for lifecycle and failure modes.

    ``backoff_initial``/``backoff_max`` (seconds) bound the reconnect delay (doubling, with
    50-100 % jitter); ``guild_ready_timeout`` is discord.py's wait after the last
    GUILD_CREATE; ``start_timeout`` bounds how long ``start`` waits for the first outcome.
    Raises ValueError when the account has no token.
    """

    name = "discord"

    def __init__(self, account_id: str, config: DiscordAccount, *, clock: Clock = SYSTEM_CLOCK,
                 backoff_initial: float = 1.0, backoff_max: float = 60.0,
                 guild_ready_timeout: float = 2.0, start_timeout: float = 30.0,
                 media: Any = None, cursor_path: Path | None = None,
                 cursor_records: Any = None, resume_path: Path | None = None) -> None:
        if not config.token:
            raise ValueError(f"channels.discord.accounts.{account_id}.token: required")
        self.account_id = account_id
        self.state: ChannelState = "stopped" if config.enabled else "disabled"
        self._config = config
        self._token = config.token.strip()
        self._clock = clock
        self._backoff = (backoff_initial, backoff_max)
        self._guild_ready_timeout = guild_ready_timeout
        self._start_timeout = start_timeout
        self._rng = random.Random()
        self._client: discord.Client | None = None
        self.on_press: Any = None  # the gateway's ButtonPress handler (channels/base.py)
        self._task: asyncio.Task | None = None
        self._settled = asyncio.Event()
        self._stopping = False
        self._attempt = 0
        self._on_message: InboundHandler | None = None
        self._on_event: EventHandler | None = None
        self._raw: Bounded = Bounded(_RAW_KEEP)
        self._dm_channels: Bounded = Bounded(_DM_KEEP)  # user id -> DM channel id
        self._dm_peers: Bounded = Bounded(_DM_KEEP)  # DM channel id -> user id
        self._bot_id: int | None = None
        self._bot_username: str | None = None
        self._last_error: str | None = None
        self._connected_since: float | None = None
        self._connects = ConnectionCount()
        # catch-up after a crash or takeover (catchup.py); records: PostgreSQL's copy
        self._cursors = ChannelCursors(cursor_path, cursor_records)
        self._catching_up: asyncio.Task | None = None
        self._catch_up_due = True  # at the first fresh IDENTIFY of each start()
        # gateway session RESUME across processes (resume.py); replicas: own()
        self.resume_store: Any = ResumeFile(resume_path) if resume_path else None
        self.lease_check: Callable[[], Any] | None = None
        self._tracker = SessionTracker(None, account_id)
        self._command_replies = CommandReplies(clock, ttl=TOKEN_TTL, platform="discord")
        self._tree: Any = None  # the client's app_commands.CommandTree (commands.py)
        self._syncing: asyncio.Task | None = None  # once per start()
        self._reply_threads = ReplyThreads()  # reply_in_thread (threads.py)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, on_message: InboundHandler, on_event: EventHandler) -> None:
        """Start the supervised connection; returns once connected, retrying in the
        background, or failed (never raises for network trouble or a bad token)."""
        if self._task is not None and not self._task.done():
            return
        if not self._config.enabled:
            self.state = "disabled"
            return
        self._on_message, self._on_event = on_message, on_event
        self._stopping = False
        self._settled = asyncio.Event()
        configure_endpoints(self._config)
        self._set_state("starting")
        self._tracker = SessionTracker(self.resume_store, self.account_id)
        await self._tracker.load()
        await asyncio.to_thread(self._cursors.reload)  # another replica may have moved them
        self._catch_up_due = True
        self._task = asyncio.create_task(self._supervise(), name=f"discord:{self.account_id}")
        with suppress(TimeoutError):
            async with maybe_timeout(self._clock, self._start_timeout):
                await self._settled.wait()

    async def stop(self) -> None:
        """Close the gateway connection and the HTTP session; idempotent."""
        self._stopping = True
        client, task = self._client, self._task
        if client is not None:
            with suppress(Exception):
                await close_resumable(client)  # the next start or owner RESUMEs it
        await self._tracker.save_final()
        await self._command_replies.close()
        for pending in (task, self._catching_up, self._syncing):
            if pending is not None and not pending.done():
                await cancel_and_wait(pending)
        self._task = self._syncing = None
        if self.state != "disabled":
            self._set_state("stopped")

    def status(self) -> dict[str, Any]:
        """``{"state", "account_id", "bot_id", "bot_username", "last_error",
        "connected_since"}`` (``connected_since`` RFC 3339 UTC or None, as the other
        adapters report it)."""
        return {"state": self.state, "account_id": self.account_id,
                "bot_id": str(self._bot_id) if self._bot_id else None,
                "bot_username": self._bot_username, "last_error": self._last_error,
                "connected_since": utc_iso(self._connected_since)
                if self._connected_since is not None else None,
                "reconnects": self._connects.reconnects}

    def _set_state(self, state: ChannelState) -> None:
        if state != self.state:
            log.info("discord_state", account_id=self.account_id, state=state,
                     previous=self.state)
        self.state = state
        if state in ("connected", "reconnecting", "failed"):
            self._settled.set()

    def _redact(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text

    def _describe(self, exc: BaseException) -> str:
        return self._redact(f"{type(exc).__name__}: {exc}".strip().rstrip(":"))

    def _fail(self, reason: str) -> None:
        self._last_error = reason
        log.error("discord_channel_failed", account_id=self.account_id, reason=reason)
        self._set_state("failed")

    async def _supervise(self) -> None:
        """Log in and run the gateway until stop(); back off (clock) and retry on error."""
        while not self._stopping:
            client = self._new_client()
            self._client = client
            error: str | None = None
            try:
                async with maybe_timeout(self._clock, self._start_timeout):
                    await client.login(self._token)
                await self._run_gateway(client)
                error = "gateway connection closed"
            except asyncio.CancelledError:
                raise
            except discord.LoginFailure:
                self._fail(LOGIN_REJECTED)
            except discord.ConnectionClosed as exc:
                if exc.code in FATAL_CLOSE_CODES:
                    self._fail(FATAL_CLOSE_CODES[exc.code])
                else:
                    error = f"gateway closed with code {exc.code}"
            except Exception as exc:  # noqa: BLE001 - any failure means: back off, retry
                error = self._describe(exc)
            finally:
                with suppress(Exception):
                    await client.close()
            if self.state == "failed" or self._stopping:
                return
            self._last_error = error
            delay = min(self._backoff[1], self._backoff[0] * 2 ** min(self._attempt, 16))
            delay *= 0.5 + self._rng.random() / 2
            self._attempt += 1
            self._set_state("reconnecting")
            log.warning("discord_reconnect_scheduled", account_id=self.account_id,
                        error=error, attempt=self._attempt, delay_s=round(delay, 3))
            await self._clock.sleep(delay)

    def own(self, resume_store: Any, lease_check: Callable[[], Any],
            fence: tuple[str, str, int]) -> None:
        """Run as the holder of an account lease (gateway/cluster/accounts.py): the
        resume state goes to ``resume_store`` (fenced), ``lease_check()`` is asked before
        resuming a session, catch-up cursor writes carry ``fence`` (lease, replica,
        generation)."""
        self.resume_store, self.lease_check = resume_store, lease_check
        self._cursors.fence(*fence)

    async def _run_gateway(self, client: discord.Client) -> None:
        """The gateway connection: RESUME of the known session, else IDENTIFY."""
        start = self._tracker.position()
        if start is not None and not await self._may_resume():
            raise ConnectionError("the account lease is no longer this replica's")
        await run_gateway(client, start, self._may_resume)

    async def _may_resume(self) -> bool:
        if self._stopping:  # stop() closed the socket resumable: not for us to resume
            return False
        return self.lease_check is None or bool(await self.lease_check())

    # ------------------------------------------------------------------ client wiring

    def _new_client(self) -> discord.Client:
        client = new_client(self._config, guild_ready_timeout=self._guild_ready_timeout)
        track_parsers(client, self._tracker)  # before guard_parsers (resume.py)
        guard_parsers(client, self._parse_failed, self._stash_raw)
        handlers: dict[str, Callable[..., Any]] = {
            "on_connect": lambda: self._connected(client, resumed=False),
            "on_resumed": lambda: self._connected(client, resumed=True),
            "on_disconnect": lambda: self._disconnected(client),
            "on_message": lambda m: self._on_gateway_message(client, m),
            "on_raw_reaction_add": lambda p: self._handle_raw_event(client, "reaction", p),
            "on_raw_reaction_remove": lambda p: self._handle_raw_event(client, "reaction", p),
            "on_raw_message_edit": lambda p: self._handle_raw_event(client, "edit", p),
            "on_raw_message_delete": lambda p: self._handle_raw_event(client, "delete", p),
            "on_guild_channel_pins_update": lambda c, _t: self._handle_raw_event(
                client, "pins", c),
            "on_private_channel_pins_update": lambda c, _t: self._handle_raw_event(
                client, "pins", c),
            "on_interaction": self._on_interaction,
            "on_error": self._handle_error,
        }
        for attr, fn in handlers.items():
            setattr(client, attr, fn)
        if self._config.native_commands:
            self._tree = build_tree(client, lambda i, name, value: self._handle_command(
                client, i, name, value))
        return client

    async def _on_interaction(self, interaction: discord.Interaction) -> None:
        """A button press goes to ``on_press`` (channels/discord/buttons.py); commands are
        the command tree's."""
        press = press_of(interaction, self.account_id)
        if press is not None and self.on_press is not None:
            try:
                await self.on_press(press)
            finally:
                await press.answer("")  # a press is always answered (the 3 s deadline)

    async def send_buttons(self, to: str, text: str, buttons: list[Any]) -> str:
        """channels/base.py ``ButtonChannel`` (channels/discord/buttons.py)."""
        client = self._ready_client()
        if client is None:
            raise RuntimeError(f"discord account {self.account_id} is not connected")
        return await send_buttons(client, to, text, buttons, self._dm_channels,
                                  clock=self._clock, timeout=self._config.send_timeout)

    async def close_buttons(self, to: str, message_id: str, text: str) -> None:
        client = self._ready_client()
        if client is None:
            raise RuntimeError(f"discord account {self.account_id} is not connected")
        await close_buttons(client, message_id, text)

    def _parse_failed(self, event: str, exc: Exception) -> None:
        log.warning("discord_event_malformed", account_id=self.account_id,
                    discord_event=event, error=self._describe(exc))

    def _stash_raw(self, data: dict[str, Any]) -> None:
        self._raw[str(data["id"])] = data

    async def _connected(self, client: discord.Client, *, resumed: bool) -> None:
        if client is not self._client or client.user is None:
            return
        self._attempt = 0
        self._bot_id, self._bot_username = client.user.id, client.user.name
        self._connected_since = self._clock.time()
        self._connects.connected()
        log.info("discord_connected", account_id=self.account_id, bot_id=str(client.user.id),
                 bot_username=client.user.name, resumed=resumed)
        self._set_state("connected")
        if self._tree is not None and self._syncing is None:
            self._syncing = asyncio.get_running_loop().create_task(sync_commands(
                self._tree, self._config.guild_ids, account_id=self.account_id))
        if not resumed and self._catch_up_due and self._cursors.items():
            self._catch_up_due = False
            self._catching_up = asyncio.get_running_loop().create_task(catch_up(
                client, self._cursors, self._handle_message, self._stash_raw,
                self.account_id))

    async def _on_gateway_message(self, client: discord.Client,
                                  message: discord.Message) -> None:
        try:
            await self._handle_message(client, message)
        finally:  # journaled (or never will be): the session position may move past it
            self._tracker.done(str(message.id))

    async def _disconnected(self, client: discord.Client) -> None:
        if client is self._client and not self._stopping and self.state == "connected":
            self._set_state("reconnecting")

    async def _handle_error(self, event_method: str, *args: Any, **kwargs: Any) -> None:
        # discord.py calls this from inside its except block: exc_info is current.
        log.exception("discord_handler_error", account_id=self.account_id,
                      handler=event_method)
