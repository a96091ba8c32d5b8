"""The PostgreSQL :class:`runtime.storage.pairing.PairingRecords` backend: table
``pairing`` (``migrations/0015_pairing.sql``), one row per channel. A writer holds the
row ``FOR UPDATE`` for its read-modify-write (the CLI and every replica queue up there).

``signature`` is on the inbound hot path (``is_approved``): it asks the database at most
once per ``REFRESH`` seconds per channel, and while PostgreSQL is unreachable it keeps
answering with the last known state (pausing ``PAUSE`` seconds between attempts) instead
of stalling intake. On the gateway's event loop a known signature that is due is
answered as known and refreshed in the background (on the bridge's loop), so intake
never waits for the database; only the very first look at a channel, and reading a
document that changed, wait for it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg
import structlog

from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.pool import DB_ERRORS as _DB_ERRORS
from runtime.storage.postgres.pool import redact_dsn

log = structlog.get_logger(__name__)

REFRESH = 1.0  # seconds a signature is trusted
PAUSE = 5.0  # seconds without asking after a failure
TIMEOUT = 2.0  # seconds one hot-path query may take


def _rev(channel: str) -> Callable[[asyncpg.Connection], Any]:
    return lambda c: c.fetchval(
        "SELECT rev FROM pairing WHERE channel = $1 AND body IS NOT NULL", channel)


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class PgPairingRecords:
    """Pairing documents in PostgreSQL through a shared :class:`SyncBridge`."""

    def __init__(self, bridge: SyncBridge) -> None:
        self.bridge = bridge
        self.name = f"postgresql pairing ({redact_dsn(bridge.dsn)})"
        self._sigs: dict[str, tuple[float, int | None]] = {}  # channel -> (checked, rev)
        self._paused_until = 0.0
        self._held = threading.local()  # .doc: (channel, rev, body) read under our lock
        self._refreshing: set[str] = set()  # channels whose signature is being re-read

    def where(self, channel: str) -> str:
        return f"{self.name} channel {channel}"

    def channels(self) -> list[str]:
        try:
            rows = self.bridge.call(lambda c: c.fetch(
                "SELECT channel FROM pairing WHERE body IS NOT NULL ORDER BY channel"))
        except _DB_ERRORS as exc:
            log.warning("pairing_store_unreachable", error=str(exc))
            return []
        return [r[0] for r in rows]

    def _under_lock(self, channel: str) -> tuple[int | None, bytes | None] | None:
        doc = getattr(self._held, "doc", None)
        return (doc[1], doc[2]) if doc is not None and doc[0] == channel else None

    def signature(self, channel: str) -> int | None:
        if (held := self._under_lock(channel)) is not None:
            return held[0]
        now = time.monotonic()
        cached = self._sigs.get(channel)
        if cached is not None and (now - cached[0] < REFRESH or now < self._paused_until):
            return cached[1]
        if cached is not None and _on_event_loop():
            self._refresh_soon(channel)
            return cached[1]
        try:
            rev = self.bridge.call(_rev(channel), timeout=TIMEOUT)
        except _DB_ERRORS as exc:
            self._unreachable(channel, exc)
            return cached[1] if cached is not None else None
        self._sigs[channel] = (now, rev)
        return rev

    def _refresh_soon(self, channel: str) -> None:
        """Re-read the channel's signature on the bridge's loop (once at a time)."""
        if channel in self._refreshing:
            return
        self._refreshing.add(channel)

        async def refresh(run: Callable) -> None:
            try:
                rev = await asyncio.wait_for(run(_rev(channel)), TIMEOUT)
                self._sigs[channel] = (time.monotonic(), rev)
            except _DB_ERRORS as exc:
                self._unreachable(channel, exc)
            finally:
                self._refreshing.discard(channel)
        self.bridge.spawn(refresh)

    def _unreachable(self, channel: str, exc: BaseException) -> None:
        self._paused_until = time.monotonic() + PAUSE
        log.error("pairing_store_unreachable", channel=channel, error=str(exc),
                  effect=f"the last known approvals stand for {PAUSE:g}s")

    def read(self, channel: str) -> bytes | None:
        if (held := self._under_lock(channel)) is not None:
            return held[1]
        try:
            body = self.bridge.call(lambda c: c.fetchval(
                "SELECT body FROM pairing WHERE channel = $1", channel))
        except _DB_ERRORS as exc:
            raise OSError(f"{self.where(channel)}: read failed ({exc})") from None
        return bytes(body) if body is not None else None

    @contextmanager
    def locked(self, channel: str) -> Iterator[Callable[[bytes], None]]:
        out: list[bytes] = []
        try:
            with self.bridge.hold() as run:
                tr = run(_begin)
                try:
                    run(lambda c: c.execute("INSERT INTO pairing (channel) VALUES ($1) ON "
                                            "CONFLICT DO NOTHING", channel))
                    run(lambda c: c.execute("SELECT 1 FROM pairing WHERE channel = $1 FOR "
                                            "UPDATE", channel))
                    # The caller re-reads under the lock: serve that from this transaction's
                    # connection (the pool may have none to spare while we hold the row).
                    row = run(lambda c: c.fetchrow(
                        "SELECT rev, body FROM pairing WHERE channel = $1", channel))
                    body = bytes(row["body"]) if row["body"] is not None else None
                    self._held.doc = (channel, row["rev"] if body is not None else None, body)
                    try:
                        yield out.append
                    finally:
                        self._held.doc = None
                    if out:
                        run(lambda c: c.execute(
                            "UPDATE pairing SET body = $2, rev = rev + 1, updated_at = now() "
                            "WHERE channel = $1", channel, out[-1]))
                except BaseException:
                    run(lambda c: tr.rollback())
                    raise
                run(lambda c: tr.commit())
        except _DB_ERRORS as exc:
            raise OSError(f"{self.where(channel)}: write failed ({exc})") from None
        self._sigs.pop(channel, None)  # our own change: seen at once


async def _begin(conn: asyncpg.Connection) -> asyncpg.transaction.Transaction:
    tr = conn.transaction()
    await tr.start()
    return tr
