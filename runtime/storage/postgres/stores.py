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


def _outbox(bridge: SyncBridge, replica: str, ttl: float = 15.0) -> Any:
    from runtime.storage.postgres.outbox import PgOutboxRecords
    return PgOutboxRecords(bridge, replica, ttl)


def _dedupe(bridge: SyncBridge, replica: str) -> Any:
    from runtime.storage.postgres.dedupe import PgDedupeRecords
    return PgDedupeRecords(bridge)


def _document(name: str) -> Any:
    def make(bridge: SyncBridge, replica: str) -> Any:
        from runtime.storage.postgres.documents import PgDocument
        return PgDocument(bridge, name)
    return make


def _discord_cursors(bridge: SyncBridge, replica: str, account: str) -> Any:
    from runtime.storage.postgres.documents import PgDocument
    return PgDocument(bridge, f"discord/{account}/cursors.json")


def _usage(bridge: SyncBridge, replica: str) -> Any:
    from runtime.storage.postgres.usage import PgUsageRecords
    return PgUsageRecords(bridge)


def _subagents(bridge: SyncBridge, replica: str) -> Any:
    from runtime.storage.postgres.subagents import PgRunRecords
    return PgRunRecords(bridge, replica)


def _pairing(bridge: SyncBridge, replica: str) -> Any:
    from runtime.storage.postgres.pairing import PgPairingRecords
    return PgPairingRecords(bridge)


STORES = {"cron": _cron, "outbox": _outbox, "dedupe": _dedupe, "pairing": _pairing,
          "usage": _usage, "discord_cursors": _discord_cursors, "subagents": _subagents,
          "heartbeat_ledger": _document("heartbeat/delivered.json"),
          "auth_state": _document("auth-state.json")}


def open_records(name: str, bridge: SyncBridge, *, replica: str = "", **opts: Any) -> Any:
    """The PostgreSQL backend of store ``name`` (``opts``: that store's extras, e.g. the
    outbox's ``ttl``). Raises KeyError for an unknown name."""
    return STORES[name](bridge, replica, **opts)
