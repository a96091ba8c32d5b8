"""The session store interface: session key -> one entry record (a JSON object).

The record's shape belongs to the gateway (``gateway.sessions.entry.SessionEntry.to_json``);
a backend stores it opaquely next to the two columns it indexes (``session_key``, unique,
and ``session_id``). Persisting one session's change must cost the same whatever the
number of sessions (issue 9 "Session store at scale"): backends write changed rows, never
the whole store.
"""

from __future__ import annotations

from typing import Any, Protocol


class SessionStoreError(Exception):
    """The store cannot be used. ``path`` names the file (or database) and ``fix`` says
    what the operator can do; str() carries both."""

    def __init__(self, message: str, *, path: str, fix: str) -> None:
        super().__init__(f"{message}; fix: {fix}")
        self.reason = message
        self.path = path
        self.fix = fix


class SessionRecords(Protocol):
    """Blocking backend API (callers run it off the event loop)."""

    def load_all(self) -> dict[str, dict[str, Any]]:
        """Every record by session key. Raises SessionStoreError when unreadable."""

    def write(self, upserts: dict[str, dict[str, Any]], deletes: list[str]) -> int:
        """Insert or replace ``upserts`` and delete ``deletes`` in ONE transaction.
        Returns the number of rows written. Raises OSError/SessionStoreError."""

    def close(self) -> None:
        """Release the connection."""
