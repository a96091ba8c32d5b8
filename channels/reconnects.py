"""Counting an adapter's reconnects (``channel_reconnects_total`` in ``/metrics``).

Each adapter calls :meth:`ConnectionCount.connected` whenever it reaches ``connected``
(its first connect, and every one after a drop: a new Socket Mode WebSocket, a Discord
RESUME or new session, the first good ``getUpdates`` after a failed one). Counted where
it happens, not by polling ``status()``, so a drop and reconnect between two polls is
still one reconnect.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ConnectionCount:
    """Connects of one adapter instance; every connect after the first is a reconnect."""

    connects: int = 0

    def connected(self) -> None:
        self.connects += 1

    @property
    def reconnects(self) -> int:
        return max(0, self.connects - 1)
