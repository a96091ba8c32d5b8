"""Channel accounts on replicas (issue 15 "Channel accounts"; README "Replicas").

Each account — a Telegram poller, a Slack socket, a Discord gateway connection — runs on
exactly one live replica: the holder of lease ``account:<channel>:<account>``. A replica
takes free accounts up to its fair share (ceil(accounts / live replicas)) and gives one
back when it holds more than that, so a cluster spreads its accounts. When the owner dies
its leases lapse with its heartbeat (``cluster.lease_ttl``) and another replica starts the
account; the Telegram ``getUpdates`` offset lives in PostgreSQL (:class:`OffsetStore`), so
the new owner goes on where the old one stopped (an update seen twice is refused by the
intake's unique dedupe key).

On the other replicas the account is a :class:`RemoteChannel`: replies their lanes send
to it are queued in ``cluster_outbound`` and drained by the owner, which sends them with
its own deliverer (its outbox keeps what fails). A Discord account's owner keeps its gateway
session (session id, acknowledged sequence number, resume_gateway_url) in the fenced row
``discord:<account>:resume``: the next owner RESUMEs it and Discord replays what nobody
received (channels/discord/resume.py). Webhook modes (Telegram webhook, Slack
HTTP events) have no connection to own: they run on every replica, behind a load balancer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any

import asyncpg
import structlog

from channels.base import Channel, DeliveryResult, OutboundMessage
from gateway.cluster import buttons, membership
from gateway.cluster.db import ClusterDB, ClusterUnavailable

log = structlog.get_logger(__name__)

OUTBOUND = "tidegate_outbound"
_ACCOUNT_OF_M = "'account:' || m.n"  # the lease name of unnest row m (drain)
MIN_HOLD = 1.0  # lease TTLs an account stays before it is given back for balance


def account_name(ch: Channel) -> str:
    return f"{ch.name}:{ch.account_id}"


class OffsetStore:
    """A JSON value in ``cluster_channel_state`` (the Telegram ``getUpdates`` offset),
    written only by the holder of ``lease`` with ``generation`` (fenced: a replica that
    lost the account while paused never writes an old offset over the new owner's)."""

    def __init__(self, db: ClusterDB, name: str, *, replica: str = "", lease: str = "",
                 generation: int = 0) -> None:
        self.db, self.name = db, name
        self.replica, self.lease, self.generation = replica, lease, generation
        self.fenced = 0

    async def load(self) -> Any:
        raw = await self.db.retry(lambda c: c.fetchval(
            "SELECT value FROM cluster_channel_state WHERE name = $1", self.name),
            what="channel state")
        return json.loads(raw) if raw is not None else None

    async def save(self, value: Any) -> None:
        """Best effort: a lost save only means updates seen again (and deduplicated). A
        save refused by the fence is logged (``cluster_offset_fenced``)."""
        try:
            wrote = await self.db.run(lambda c: c.fetchval(
                "INSERT INTO cluster_channel_state (name, value, written_by) SELECT $1, "
                f"$2::jsonb, $3 WHERE {membership.holds('$4', '$3', '$5')} "
                "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, updated_at = "
                "now(), written_by = EXCLUDED.written_by RETURNING true",
                self.name, json.dumps(value), self.replica, self.lease, self.generation))
        except ClusterUnavailable:
            return
        if not wrote:
            self.fenced += 1
            log.warning("cluster_offset_fenced", name=self.name, replica=self.replica,
                        generation=self.generation, value=value,
                        reason="the account lease is no longer this replica's")


class RemoteChannel:
    """An account another replica owns: ``send`` queues the message for the owner."""

    def __init__(self, real: Channel, db: ClusterDB) -> None:
        self.real, self.db = real, db
        self.name, self.account_id = real.name, real.account_id
        self.state = "remote"

    async def start(self, on_message: Any, on_event: Any) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        payload = json.dumps(dataclasses.asdict(message), ensure_ascii=False)
        try:
            await self.db.run(lambda c: _queue(c, message, payload))
        except ClusterUnavailable as exc:
            return DeliveryResult(ok=False, error=str(exc), retryable=True)
        return DeliveryResult(ok=True)

    async def typing(self, to: str, thread_id: str | None = None) -> None:
        return None

    async def act(self, action: str, route: Any, args: dict[str, Any]) -> str:
        raise RuntimeError(f"{self.name}:{self.account_id} runs on another replica")

    def status(self) -> dict[str, Any]:
        return {"state": "remote"}


class RemoteButtonChannel(buttons.RemoteButtons, RemoteChannel):
    """A RemoteChannel whose real adapter sends buttons (gateway/cluster/buttons.py)."""

    notify = OUTBOUND


def remote_channel(real: Channel, db: ClusterDB) -> RemoteChannel:
    """The stand-in for ``real`` on replicas that do not run it."""
    cls = RemoteButtonChannel if hasattr(real, "send_buttons") else RemoteChannel
    return cls(real, db)


async def _queue(conn: asyncpg.Connection, message: OutboundMessage, payload: str) -> None:
    async with conn.transaction():
        await conn.execute("INSERT INTO cluster_outbound (channel, account, message) VALUES "
                           "($1, $2, $3::jsonb)", message.channel, message.account_id, payload)
        await conn.execute("SELECT pg_notify($1, $2)", OUTBOUND,
                           f"{message.channel}:{message.account_id}")


class Accounts:
    """Ownership of ``gw.channels`` for this replica (``tick()`` from the cluster loop)."""

    def __init__(self, gw: Any, db: ClusterDB, replica: str, ttl: float) -> None:
        self.gw, self.db, self.me, self.ttl = gw, db, replica, ttl
        # Webhook accounts (Telegram webhook, Slack HTTP events, WhatsApp) run on every replica:
        # there is no connection to own, the load balancer picks the replica.
        self.webhooks = [ch for ch in gw.channels if _webhook(ch)]
        self.channels = {account_name(ch): ch for ch in gw.channels if not _webhook(ch)}
        self.remote = {name: remote_channel(ch, db) for name, ch in self.channels.items()}
        self.running: dict[str, float] = {}  # account -> time.monotonic() started
        self.generations: dict[str, int] = {}  # account -> lease generation it runs under
        for name in self.channels:
            gw.deliverer.register(self.remote[name])

    async def start_webhooks(self) -> None:
        for ch in self.webhooks:
            error = await self._start_bounded(ch)
            if error is not None:  # as gateway/channels/boot.py does
                log.error("channel_start_failed", channel=ch.name, account=ch.account_id,
                          error=error)

    async def _start_bounded(self, ch: Any) -> str | None:
        """``ch.start`` bounded by ``gateway.channel_start_timeout`` (None, or the error)."""
        from gateway.channels.starting import start_channel
        gw = self.gw
        return await start_channel(ch, gw.intake.on_message, gw.intake.on_event,
                                   timeout=gw.config.gateway.channel_start_timeout,
                                   clock=gw.clock, abort=gw.start_abort)

    async def tick(self) -> None:
        if not self.channels:
            return
        live, held = await self.db.run(self._view)
        mine = set(held)
        for name in list(self.running):  # lost it (an outage, a pause past the TTL)
            if held.get(name) != self.generations.get(name):
                log.warning("cluster_account_lost", account=name)
                await self._stop(name, release=False)
        share = math.ceil(len(self.channels) / max(1, len(live)))
        for name in self._order():
            if len(mine) >= share:
                break
            if name in mine:
                continue
            ttl = self.db.peer_ttl(self.ttl)  # nobody is dead just after an outage
            holder, generation = await self.db.run(lambda c, n=name, t=ttl: membership.acquire_fenced(
                c, "account:" + n, self.me, t))
            if holder == self.me:
                mine.add(name)
                held[name] = generation
        for name in sorted(mine - set(self.running)):
            await self._start(name, held[name])
        if len(mine) > share:  # rebalance: one at a time, never a fresh one
            name = min(self.running, key=self.running.__getitem__, default=None)
            if name and time.monotonic() - self.running[name] > MIN_HOLD * self.ttl:
                await self._stop(name, release=True)

    async def _view(self, conn: asyncpg.Connection) -> tuple[list[str], dict[str, int]]:
        """Live replicas, and the accounts this replica holds with their generations."""
        live = await membership.live_replicas(conn, self.ttl)
        rows = await conn.fetch("SELECT name, generation FROM cluster_leases WHERE "
                                "replica_id = $1 AND name LIKE 'account:%'", self.me)
        held = {r["name"].removeprefix("account:"): r["generation"] for r in rows}
        return live, {n: g for n, g in held.items() if n in self.channels}

    def _order(self) -> list[str]:
        """Accounts in an order that differs per replica, so replicas starting together
        pick different ones first."""
        names = sorted(self.channels)
        shift = sum(map(ord, self.me)) % len(names)
        return names[shift:] + names[:shift]

    async def _start(self, name: str, generation: int) -> None:
        ch = self.channels[name]
        self.generations[name] = generation
        if ch.name == "telegram":
            ch.offset_store = OffsetStore(self.db, f"telegram:{ch.account_id}:offset",
                                          replica=self.me, lease="account:" + name,
                                          generation=generation)
        elif ch.name == "discord":  # gateway session resume state, catch-up cursors
            ch.own(OffsetStore(self.db, f"discord:{ch.account_id}:resume", replica=self.me,
                               lease="account:" + name, generation=generation),
                   lambda n=name, g=generation: self.holds(n, g),
                   ("account:" + name, self.me, generation))
        error = await self._start_bounded(ch)
        if error is not None:  # the lease stays; status shows the error
            log.error("channel_start_failed", channel=ch.name, account=ch.account_id,
                      error=error)
        self.gw.deliverer.register(ch)
        self.running[name] = time.monotonic()
        log.info("cluster_account_owned", account=name, replica=self.me, state=ch.state)

    async def holds(self, name: str, generation: int) -> bool:
        """This replica still holds account ``name`` with ``generation`` (True when
        PostgreSQL cannot say: the lease tick decides once it is back)."""
        try:
            return bool(await self.db.run(lambda c: c.fetchval(
                f"SELECT {membership.holds('$1', '$2', '$3')}", "account:" + name,
                self.me, generation)))
        except ClusterUnavailable:
            return True

    async def _stop(self, name: str, *, release: bool) -> None:
        ch = self.channels[name]
        self.gw.deliverer.register(self.remote[name])
        self.running.pop(name, None)
        from gateway.channels.stopping import stop_channels
        await stop_channels([ch], timeout=self.gw.config.gateway.channel_stop_timeout,
                            clock=self.gw.clock)  # bounded, never raises
        if release:
            await self.db.run(lambda c: membership.release(c, "account:" + name, self.me))
            log.info("cluster_account_released", account=name, reason="balance")

    async def drain(self) -> int:
        """Send the queued replies (and messages with buttons: gateway/cluster/buttons.py)
        of the accounts this replica runs."""
        if not self.running:
            return 0
        await buttons.drain(self.db, self.channels, list(self.running))
        names = list(self.running)
        gens = [self.generations.get(n, 0) for n in names]
        # fenced: only accounts whose lease is still this replica's, same generation
        rows = await self.db.run(lambda c: c.fetch(
            "UPDATE cluster_outbound SET claimed_by = $1 WHERE id IN (SELECT o.id FROM "
            "cluster_outbound o JOIN unnest($2::text[], $3::bigint[]) AS m(n, g) ON "
            "o.channel || ':' || o.account = m.n WHERE o.claimed_by IS NULL AND "
            f"{membership.holds(_ACCOUNT_OF_M, '$1', 'm.g')} "
            "ORDER BY o.id FOR UPDATE OF o SKIP LOCKED LIMIT 200) RETURNING id, message",
            self.me, names, gens))
        for r in sorted(rows, key=lambda r: r["id"]):
            msg = OutboundMessage(**json.loads(r["message"]))
            await self.gw.deliverer.send_message(msg)  # failures go to this outbox
            await self.db.retry(lambda c, i=r["id"]: c.execute(
                "DELETE FROM cluster_outbound WHERE id = $1", i), what="outbound")
        return len(rows)

    async def requeue_dead(self) -> None:
        """Replies claimed by a replica that died before sending them go back."""
        await self.db.run(lambda c: c.execute(
            "UPDATE cluster_outbound o SET claimed_by = NULL WHERE claimed_by IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM cluster_replicas r WHERE r.id = o.claimed_by AND "
            f"{membership.alive('$1')})", self.db.peer_ttl(self.ttl)))

    async def stop(self) -> None:
        for name in list(self.running):
            await self._stop(name, release=False)  # leave() gives every lease back


def _webhook(ch: Channel) -> bool:
    """Webhook mode (Telegram, Slack) or a channel that only has webhooks (WhatsApp:
    ``webhook_only``)."""
    return bool(getattr(ch, "webhook_only", False)) or \
        getattr(getattr(ch, "config", None), "mode", None) in ("webhook", "http")
