"""Connection supervision of the Slack adapter (``SlackChannel`` in
channels/slack/adapter.py), done here rather than by the SDK: the SDK's auto-reconnect sleeps
on the real clock without jitter and tells nobody it lost the link.

The supervisor calls ``auth.test`` (learns the bot's user id), opens the socket
(``apps.connections.open`` + the returned ``ws://`` URL), watches it (close/error callbacks
plus a periodic check), and on loss reconnects with exponential backoff and jitter on the
injected clock. ``state`` moves starting -> connected -> reconnecting -> connected, or ->
failed when Slack rejects a token. Slack's own ``disconnect`` (refresh) messages are still
handled by the SDK in place. HTTP mode only authenticates, then waits for ``stop``.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import structlog
from slack_sdk.errors import SlackApiError

from channels.slack.api import api_failure, describe_error
from channels.slack.events import BotIdentity
from runtime.clock import maybe_timeout

log = structlog.get_logger(__name__)

STABLE_AFTER = 30.0  # s a connection must last before the backoff resets


class AuthFailed(Exception):
    """Slack rejected a token (``invalid_auth`` & co.): the account needs a config fix."""

    def __init__(self, token: str, error: str | None) -> None:
        super().__init__(f"slack rejected the {token}: {error}")
        self.token, self.error = token, error



class SlackConnection:
    """The supervisor of one account's link (mixed into ``SlackChannel``, whose
    ``__init__``/``start`` set the attributes used here)."""

    _clock: Any
    _web: Any
    _socket: Any
    _bot: BotIdentity | None
    account_id: str

    async def _supervise(self) -> None:
        attempt = 0
        try:
            while not self._stopping:
                try:
                    async with maybe_timeout(self._clock, self._connect_timeout):
                        await self._connect_once()
                except AuthFailed as exc:
                    self._fail(exc)
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - every failure means "retry later"
                    delay = self._delay(attempt)
                    attempt += 1
                    self._reconnecting(describe_error(exc), delay)
                    self._first_attempt.set()
                    await self._clock.sleep(delay)
                    continue
                self._connected()
                since = self._clock.monotonic()
                await self._wait_disconnected()
                if self._stopping:
                    return
                lasted = self._clock.monotonic() - since
                attempt = 0 if lasted >= STABLE_AFTER else attempt + 1
                delay = self._delay(attempt - 1) if attempt else 0.0
                self._reconnecting("connection lost", delay)
                if delay:
                    await self._clock.sleep(delay)
        finally:
            self._first_attempt.set()

    async def _connect_once(self) -> None:
        """auth.test (once), then the Socket Mode connection. Raises AuthFailed for token
        errors, anything else for trouble worth retrying."""
        assert self._web is not None
        if self._bot is None:
            try:
                resp = await self._web.auth_test()
            except SlackApiError as exc:
                failure = api_failure(exc)
                if failure.auth:
                    raise AuthFailed("bot_token", failure.error) from None
                raise
            self._bot = BotIdentity(user_id=str(resp["user_id"]), bot_id=resp.get("bot_id"),
                                    username=resp.get("user"), team_id=resp.get("team_id"))
        if self._socket is None:
            return  # HTTP mode: Slack calls us
        client = self._socket.client
        # The SDK takes this lock when it follows Slack's "disconnect" (refresh) itself.
        async with client.connect_operation_lock:
            try:
                client.wss_uri = await client.issue_new_wss_url()
            except SlackApiError as exc:
                failure = api_failure(exc)
                if failure.auth:
                    raise AuthFailed("app_token", failure.error) from None
                raise
            await client.connect()

    async def _wait_disconnected(self) -> None:
        """Return when the socket is gone (HTTP mode: only at stop)."""
        while not self._stopping:
            client = self._socket.client if self._socket is not None else None
            if (client is not None and not await client.is_connected()
                    and not client.connect_operation_lock.locked()):  # not mid-refresh
                return
            try:
                async with self._clock.timeout(
                        self._watch_interval if self._socket is not None else None):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()

    async def _socket_dropped(self, message: Any) -> None:
        self._wake.set()  # the supervisor re-checks; stale callbacks are harmless

    def _delay(self, attempt: int) -> float:
        initial, cap = self._backoff
        return min(cap, initial * (2 ** min(attempt, 30))) * (0.5 + random.random() / 2)

    def _connected(self) -> None:
        assert self._bot is not None
        self.state = "connected"
        self._connects.connected()
        self._connected_since = self._clock.time()
        self._last_error = None
        self._first_attempt.set()
        log.info("slack_connected", account_id=self.account_id, mode=self.config.mode,
                 bot_user_id=self._bot.user_id, team_id=self._bot.team_id)

    def _reconnecting(self, error: str, delay: float) -> None:
        self.state = "reconnecting"
        self._connected_since = None
        self._last_error = error
        log.warning("slack_reconnecting", account_id=self.account_id, error=error,
                    retry_in=round(delay, 3))

    def _fail(self, exc: AuthFailed) -> None:
        self.state = "failed"
        self._last_error = f"{exc.token} rejected: {exc.error}"
        hint = ("check channels.slack.app_token (xapp-..., scope connections:write)"
                if exc.token == "app_token" else "check channels.slack.bot_token (xoxb-...)")
        log.error("slack_auth_failed", account_id=self.account_id, token=exc.token,
                  error=exc.error, hint=hint)
