"""Creating and starting the platform channel adapters configured under ``channels.*``.

The platforms are the loaded ``tidegate.channels`` plugins (``channels/registry.py``).
Each account of each enabled platform becomes one adapter instance. Adapters are created
before the HTTP server starts (so webhook routes can be mounted) and started after it. A
channel that fails to start is logged and reported in status; it never takes the gateway
or the other channels down.

Once started, a :class:`ChannelWatch` follows every adapter's ``state``: it logs each change
and wakes the on-disk outbox for a channel as soon as it is ``connected`` again, so replies
queued during an outage (or before a restart) go out right away instead of at the outbox's
next backoff step (issue 3 "Outbound": nothing is dropped, queued replies are retried
after recovery and after a restart).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from aiohttp import web

from channels import registry
from channels.base import Channel
from channels.sdk import Capabilities, ChannelAdapter, ChannelContext
from channels.sections import account_configs
from channels.tasks import cancel_and_wait
from gateway.channels.starting import start_channel
from gateway.routing import Route
from gateway.server.control_api import require_token
from gateway.service.storage import bridge, records
from runtime.clock import Clock

log = structlog.get_logger(__name__)

WATCH_INTERVAL = 0.5  # seconds between two looks at the adapters' state
APPROVED_TEXT = "You're approved: I'll answer your messages from now on."


def create_channels(gw: Any) -> list[Channel]:
    """One adapter per enabled account of every loaded channel plugin (``channels/sdk.py``;
    the built-ins are plugins too), registered with ``gw.deliverer``. An account whose
    ``create`` raises is listed in ``gw.problems`` (a plugin that failed to load is listed
    by ``status`` itself, runtime/plugins.py ``problems``); the other channels start."""
    out: list[Channel] = []
    for name, plugin in registry.channel_plugins().items():
        for account_id, acc in account_configs(gw.config.channels.platform(name)).items():
            try:
                ch = plugin.create(account_id, acc, channel_context(gw, name, account_id))
            except Exception as exc:  # noqa: BLE001 - one bad account must not stop the rest
                log.error("channel_create_failed", channel=name, account=account_id,
                          error=str(exc))
                gw.problems.append(f"channel {name}:{account_id} not started: {exc}")
                continue
            if not getattr(ch, "name", None):
                ch.name = name
            _declared_capabilities(ch, plugin)
            gw.deliverer.register(ch)
            out.append(ch)
    return out


def _declared_capabilities(ch: Any, plugin: Any) -> None:
    """Give a ``ChannelAdapter`` the capabilities its plugin declares (what ``plugins
    list`` shows and the tools are offered by): ``parts`` splits at that ``text_limit``
    and ``act`` runs ``react`` when it says ``reactions``. A plugin that keeps the SDK
    default leaves the adapter's own (class-level) capabilities alone."""
    caps = getattr(plugin, "capabilities", None)
    if isinstance(ch, ChannelAdapter) and isinstance(caps, Capabilities) \
            and caps != Capabilities():
        ch.capabilities = caps


def channel_context(gw: Any, name: str, account_id: str) -> ChannelContext:
    """What an adapter gets from the gateway (``channels.sdk.ChannelContext``)."""
    def account_records(kind: str, **opts: Any) -> Any:
        return records(gw, kind, **opts)

    def documents(doc: str) -> Any:
        if gw.pg is None:
            return None
        from runtime.storage.postgres.documents import PgDocument
        return PgDocument(bridge(gw), doc)

    return ChannelContext(name=name, account_id=account_id, clock=gw.clock,
                          media=gw.config.media, state_dir=gw.state_dir / "channels",
                          records=account_records, problems=gw.problems,
                          documents=documents)


async def start_channels(gw: Any) -> None:
    """Start every adapter concurrently, each for at most ``gateway.channel_start_timeout``
    (``gateway/channels/starting.py``: one that raises, hangs or is cut short by a stop is
    ``failed`` with its ``last_error``, logged and listed in ``gw.problems``; it holds
    neither the others nor readiness), then the :class:`ChannelWatch` (registered in
    ``gw.extra_services`` so the gateway stops it)."""
    await asyncio.gather(*(_start_one(gw, ch) for ch in gw.channels))
    if gw.channels:
        watch = ChannelWatch(gw.channels, gw.outbox, gw.clock)
        await watch.start()
        gw.extra_services.append(watch)


async def _start_one(gw: Any, ch: Channel) -> None:
    error = await start_channel(ch, gw.intake.on_message, gw.intake.on_event,
                                timeout=gw.config.gateway.channel_start_timeout,
                                clock=gw.clock, abort=gw.start_abort)
    if error is None:
        log.info("channel_started", channel=ch.name, account=ch.account_id, state=ch.state)
        return
    log.error("channel_start_failed", channel=ch.name, account=ch.account_id, error=error)
    gw.problems.append(f"channel {ch.name}:{ch.account_id} failed to start: {error}")


class ChannelWatch:
    """Follows ``state`` of running adapters (every ``interval`` seconds on ``clock``).

    On every change it logs ``channel_state`` (channel, account, previous, state); when an
    adapter becomes ``connected`` — first connect included, which covers entries loaded from
    disk after a restart — it calls ``outbox.wake(channel)`` so that channel's queued
    replies are due at once. ``check()`` does one pass synchronously.
    """

    def __init__(self, channels: list[Channel], outbox: Any, clock: Clock, *,
                 interval: float = WATCH_INTERVAL) -> None:
        self.channels = channels
        self.outbox = outbox
        self.clock = clock
        self.interval = interval
        self._last: dict[int, str] = {}
        self._task: asyncio.Task | None = None

    def check(self) -> None:
        for ch in self.channels:
            state, prev = ch.state, self._last.get(id(ch))
            if state == prev:
                continue
            self._last[id(ch)] = state
            if prev is not None:
                log.info("channel_state", channel=ch.name, account=ch.account_id,
                         previous=prev, state=state)
            if state == "connected":
                pending = self.outbox.pending()
                self.outbox.wake(ch.name)
                if pending:
                    log.info("outbox_woken", channel=ch.name, account=ch.account_id,
                             pending=pending)

    async def _run(self) -> None:
        while True:
            try:
                self.check()
            except Exception:  # a status glitch must not end the watch
                log.exception("channel_watch_failed")
            await self.clock.sleep(self.interval)

    async def start(self) -> None:
        if self._task is None:
            self.check()
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="channel-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)


def pairing_routes(gw: Any) -> list[web.RouteDef]:
    """Control-API route for the HTTP server (gateway/server/http.py ``build_app``):
    ``POST /api/pairing/approved`` ``{channel, sender_id, account_id?}`` (bearer token):
    DM the sender :data:`APPROVED_TEXT`. Called by ``tidegate pairing approve`` after it
    approved a code in the pairing store. 400 for a bad body, 409 when the sender is not
    approved in the store (the route cannot be used to message arbitrary ids), else 200
    ``{"ok": <delivered>, "error"}`` (an undeliverable greeting goes to the outbox)."""
    async def approved(request: web.Request) -> web.Response:
        """Tell the running gateway a pairing was approved or revoked (the CLI calls it)."""
        try:
            body = await request.json()
        except ValueError:
            body = None
        fields = (body or {}) if isinstance(body, dict) else {}
        channel, sender = fields.get("channel"), fields.get("sender_id")
        account = fields.get("account_id") or "default"
        if not all(isinstance(v, str) and v for v in (channel, sender, account)):
            return web.json_response({"ok": False, "error": "channel and sender_id "
                                      "(strings) are required"}, status=400)
        try:
            known = gw.pairing.is_approved(channel, account, sender)
        except ValueError as exc:  # invalid channel name
            return web.json_response({"ok": False, "error": str(exc)}, status=400)
        if not known:
            return web.json_response({"ok": False, "error": "sender is not approved"},
                                     status=409)
        result = await gw.deliverer.send(Route(channel, sender, account), APPROVED_TEXT,
                                         kind="notice")
        return web.json_response({"ok": result.ok, "error": result.error})

    return [web.post("/api/pairing/approved", require_token(gw, approved))]
