"""The usage ledger store interface: one record per model call, append-only (record
fields: ``runtime.usage.ledger``). Backends: ``embedded.usage_files`` (month files
``usage/YYYY-MM.jsonl``) and ``postgres.usage`` (table ``usage_records``; appends leave
the event loop at once and are retried through an outage)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol


class UsageRecords(Protocol):
    def append(self, record: dict[str, Any], now: float) -> None:
        """Add one record; ``ts`` is set from ``now`` (epoch s). Raises OSError."""

    def records(self, since: float | None = None,
                until: float | None = None) -> Iterator[dict[str, Any]]:
        """Records with ``since <= ts < until`` (epoch s; None = open), oldest first; each
        also carries ``_t``, its ``ts`` in epoch seconds."""

    def close(self) -> None:
        """Flush and release handles."""
