"""The outbox store interface: replies waiting for another delivery attempt.

The retry logic belongs to ``channels.outbound.outbox.Outbox``; a backend keeps each entry as one
JSON object (``OutboxEntry.to_json``: ``id``, ``message``, ``attempts``, ``created_at``,
``next_attempt_at``, ``last_error``) and moves given-up entries to dead letters. Backends:
``embedded.outbox_files`` (one file per entry under ``<state_dir>/outbox/``) and
``postgres.outbox`` (table ``outbox``; each row names the replica that delivers it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Unreadable:
    """An entry that could not be read: ``where`` names it, ``kept_as`` where its bytes
    are now (nothing is destroyed)."""

    where: str
    error: str
    kept_as: str


class OutboxRecords(Protocol):
    """Blocking backend API. ``path`` names the store in messages."""

    path: Any

    def load(self, parse: Callable[[dict[str, Any]], Any]) -> tuple[list[Any], list[Unreadable]]:
        """The pending entries this process delivers, each through ``parse`` (raising
        ValueError/KeyError/TypeError for a bad one), and the unreadable ones."""

    def save(self, entry: dict[str, Any]) -> None:
        """Insert or replace one pending entry. Raises OSError (nothing changed)."""

    def delete(self, entry_id: str) -> None:
        """Forget a delivered entry (unknown ids are ignored). Raises OSError."""

    def bury(self, entry: dict[str, Any]) -> None:
        """Move an entry to the dead letters. Raises OSError."""

    def adopt(self, parse: Callable[[dict[str, Any]], Any]) -> list[Any]:
        """Entries left by a process that is gone, now this one's (a shared backend;
        others return [])."""
