"""Every PostgreSQL store backend by name, for the gateway, the CLI and ``storage copy``.

``open_records(name, bridge, replica=...)``: the backend of one store over a shared
:class:`SyncBridge`; ``replica`` names the process where a store keeps per-replica rows
(the outbox's owner). Names: see :data:`STORES`.
"""

from __future__ import annotations

from typing import Any

from runtime.storage.postgres.bridge import SyncBridge


def _cron(bridge: SyncBridge, replica: str) -> Any:
    from runtime.storage.postgres.cron import PgCronRecords
    return PgCronRecords(bridge)


STORES = {"cron": _cron}


def open_records(name: str, bridge: SyncBridge, *, replica: str = "") -> Any:
    """The PostgreSQL backend of store ``name``. Raises KeyError for an unknown name."""
    return STORES[name](bridge, replica)
