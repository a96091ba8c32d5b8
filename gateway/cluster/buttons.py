"""Messages with buttons for an account another replica runs (exec approvals on replicas,
docs/exec.md): table ``cluster_buttons`` (migration 0160).

On a replica that does not run the account, :class:`RemoteButtons` (mixed into the
account's :class:`~gateway.cluster.accounts.RemoteChannel` when the real adapter has
buttons) queues the message and waits until the owner has sent it, so the caller gets the
platform's message id as with a local adapter; replacing the buttons later is queued the
same way. The owner handles both as it drains ``cluster_outbound`` (:func:`drain`), each
row under ``FOR UPDATE SKIP LOCKED`` and only for the accounts it runs, so a message is
sent by one replica once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import asyncpg
import structlog

from channels.base import Button
from gateway.cluster.db import ClusterUnavailable

log = structlog.get_logger(__name__)

SEND_WAIT = 15.0  # seconds a sender waits for the owner to send its message
POLL = 0.05  # seconds between looks at the row while waiting


class RemoteButtons:
    """``ButtonChannel`` for a RemoteChannel (``db``, ``name``, ``account_id``) whose real
    adapter sends buttons; ``notify`` is the NOTIFY channel that wakes the owner's drain."""

    db: Any
    name: str
    account_id: str
    notify: str
    on_press: Any = None  # presses arrive at the owner, never here

    async def send_buttons(self, to: str, text: str, buttons: list[Button]) -> str:
        """Queue ``text`` with ``buttons`` for chat ``to`` and wait (up to
        :data:`SEND_WAIT` s) for the owner to send it. Returns the message id. Raises
        RuntimeError when the owner's platform refused it, no owner sent it in time
        (the row is withdrawn, never sent late), or PostgreSQL is unreachable."""
        payload = json.dumps([dataclasses.asdict(b) for b in buttons])
        try:
            row = await self.db.run(lambda c: _queue(
                c, self.notify, "INSERT INTO cluster_buttons (channel, account, chat, body, buttons) "
                "VALUES ($1, $2, $3, $4, $5::jsonb) RETURNING id",
                self.name, self.account_id, to, text, payload))
            loop = asyncio.get_running_loop()
            end = loop.time() + SEND_WAIT
            while True:
                got = await self.db.run(lambda c: c.fetchrow(
                    "SELECT state, message_id, error FROM cluster_buttons WHERE id = $1", row))
                if got["state"] == "sent":
                    return str(got["message_id"])
                if got["state"] == "failed":
                    raise RuntimeError(got["error"] or "the account's replica could not send it")
                if loop.time() >= end and await self.db.run(lambda c: c.fetchval(
                        "UPDATE cluster_buttons SET state = 'failed', error = 'timeout' "
                        "WHERE id = $1 AND state = 'send' RETURNING true", row)):
                    raise RuntimeError(f"the replica running {self.name}:{self.account_id} "
                                       f"did not send it within {SEND_WAIT:g}s")
                await asyncio.sleep(POLL)
        except ClusterUnavailable as exc:
            raise RuntimeError(f"postgres unreachable: {exc}") from None

    async def close_buttons(self, to: str, message_id: str, text: str) -> None:
        """Queue the replacement of the buttons of ``message_id`` by ``text`` for the
        owner (raises RuntimeError when PostgreSQL is unreachable)."""
        try:
            await self.db.run(lambda c: _queue(
                c, self.notify, "UPDATE cluster_buttons SET state = 'close', close_text = $4 WHERE "
                "channel = $1 AND account = $2 AND message_id = $3 AND state = 'sent' "
                "RETURNING id", self.name, self.account_id, message_id, text))
        except ClusterUnavailable as exc:
            raise RuntimeError(f"postgres unreachable: {exc}") from None


async def _queue(conn: asyncpg.Connection, notify: str, sql: str, channel: str,
                 account: str, *args: Any) -> Any:
    async with conn.transaction():
        row = await conn.fetchval(sql, channel, account, *args)
        await conn.execute("SELECT pg_notify($1, $2)", notify, f"{channel}:{account}")
    return row


async def drain(db: Any, channels: dict[str, Any], running: list[str]) -> int:
    """Send (or close) the queued button messages of the accounts in ``running`` (names
    ``channel:account``, adapters in ``channels``), one row at a time under its lock.
    Returns how many rows were handled."""
    done = 0
    while running:
        handled = await db.run(lambda c: _one(c, channels, running))
        if not handled:
            return done
        done += 1
    return done


async def _one(conn: asyncpg.Connection, channels: dict[str, Any], running: list[str]
               ) -> bool:
    async with conn.transaction():
        row = await conn.fetchrow(
            "SELECT * FROM cluster_buttons WHERE state IN ('send', 'close') AND "
            "channel || ':' || account = ANY($1::text[]) ORDER BY id "
            "FOR UPDATE SKIP LOCKED LIMIT 1", running)
        if row is None:
            return False
        ch = channels[f"{row['channel']}:{row['account']}"]
        try:
            if row["state"] == "send":
                buttons = [Button(**b) for b in json.loads(row["buttons"])]
                mid = await ch.send_buttons(row["chat"], row["body"], buttons)
                await conn.execute("UPDATE cluster_buttons SET state = 'sent', "
                                   "message_id = $2 WHERE id = $1", row["id"], str(mid))
            else:
                await ch.close_buttons(row["chat"], row["message_id"], row["close_text"])
                await conn.execute("DELETE FROM cluster_buttons WHERE id = $1", row["id"])
        except Exception as exc:  # noqa: BLE001 - the sender is told, the row is done
            log.warning("cluster_buttons_failed", channel=row["channel"],
                        account=row["account"], state=row["state"], error=str(exc)[:300])
            await conn.execute("UPDATE cluster_buttons SET state = 'failed', error = $2 "
                               "WHERE id = $1", row["id"], str(exc)[:300])
    return True
