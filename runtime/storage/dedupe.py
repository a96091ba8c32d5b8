"""The inbound dedupe store interface: platform message keys seen within a TTL.

The exactly-once logic belongs to ``channels.inbound.dedupe.InboundDedupe`` (an in-memory map of
the keys this process saw, for the fast ``seen`` check); a backend persists the keys and
answers whether a key is new. Backends: ``embedded.dedupe_file`` (the append-only
``channels/inbound-seen.jsonl``) and ``postgres.dedupe`` (table ``inbound_seen``: the key
is the primary key, so "new?" is one unique constraint shared by every replica).
"""

from __future__ import annotations

from typing import Protocol

DEFAULT_TTL = 7 * 86400.0  # seconds a key stays seen


class DedupeRecords(Protocol):
    """Blocking backend API. ``path`` names the store in messages. Times: epoch s."""

    path: object

    def load(self, now: float, ttl: float) -> dict[str, float]:
        """Keys seen within ``ttl`` (oldest first) for the in-memory map; expired ones are
        dropped from the store. Raises OSError when it cannot be used at all."""

    def add(self, key: str, now: float, ttl: float) -> bool:
        """Record ``key`` as seen at ``now``; False when the store already holds it within
        ``ttl`` (another replica took the message). Raises OSError."""

    def compact(self, seen: dict[str, float], now: float, ttl: float) -> None:
        """Drop what is not in ``seen`` or expired (bounded size). Raises OSError."""

    def close(self) -> None:
        """Release handles."""
