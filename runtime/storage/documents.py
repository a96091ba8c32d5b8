"""The whole-document store interface: a small state kept as one JSON document that is
read at start and replaced on change (the heartbeat delivery ledger
``heartbeat/delivered.json``, the auth profile state ``auth-state.json``).

The owner (``scheduler.heartbeat.rules.DeliveryDeduper``,
``runtime.providers.failover.state.AuthState``) parses and encodes; a backend keeps the
bytes. Backends: ``embedded.document_file`` (the file, replaced atomically) and
``postgres.documents`` (table ``state_documents``, one row per document name; writes
leave the event loop at once and are retried through an outage, the newest wins).
"""

from __future__ import annotations

from typing import Any, Protocol


class DocumentRecords(Protocol):
    """Blocking reads, non-blocking or fast writes. ``path`` names the document."""

    path: Any

    def read(self) -> bytes | None:
        """The document, or None when there is none yet. Raises OSError."""

    def write(self, data: bytes) -> None:
        """Replace the document. Raises OSError (the file backend; PostgreSQL retries)."""

    def keep_aside(self) -> str | None:
        """Copy a corrupt document aside before it is replaced; where it went, or None
        when the copy failed (the owner must then not overwrite it)."""
