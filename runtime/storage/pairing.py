"""The DM pairing store interface: one JSON document per channel (pending codes and
approved senders; shape and rules in ``channels.access.pairing``), shared by the daemon and the
CLI at the same time.

Backends: ``embedded.pairing_files`` (``<state_dir>/pairing/<channel>.json``, writers
``flock`` ``<channel>.lock``) and ``postgres.pairing`` (table ``pairing``, one row per
channel, writers hold the row ``FOR UPDATE``), so an approval made on any replica or by
the CLI counts everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from typing import Protocol


class PairingRecords(Protocol):
    """Blocking backend API."""

    def where(self, channel: str) -> str:
        """What messages call the channel's document (its path)."""

    def channels(self) -> list[str]:
        """Channels that have a document."""

    def signature(self, channel: str) -> Hashable | None:
        """Changes whenever the document changes; None when there is none. Cheap."""

    def read(self, channel: str) -> bytes | None:
        """The document, or None. Raises OSError."""

    def locked(self, channel: str) -> AbstractContextManager[Callable[[bytes], None]]:
        """Exclusive read-modify-write across processes; yields ``write(data)``, which
        takes effect when the block exits without an exception."""
