"""The usage ledger: one record per model call, append-only, in a
:class:`runtime.storage.usage.UsageRecords` store (default: one JSON-lines file per UTC
month, ``<state_dir>/usage/YYYY-MM.jsonl``, mode 0600, ``runtime.storage.embedded.
usage_files``; with ``storage.backend: postgres`` the table ``usage_records``).

A record: ``ts`` (RFC 3339 UTC, ms), ``agent``, ``session_key``, ``channel`` (from the
session key: ``telegram``, ``webchat``, ``cron``, ... or ``-``), ``trigger``
(user|heartbeat|cron|system|subagent), ``provider``, ``model``, ``input``, ``output``,
``cache_read``, ``cache_write`` (tokens), ``cost_usd``, ``priced`` (false when the model
has no price), ``run_id``. Records are never rewritten.
"""

from __future__ import annotations

from runtime.storage.embedded.usage_files import UsageFiles

UsageLedger = UsageFiles  # the default backend, by its historical name

__all__ = ["UsageLedger", "channel_of_key"]


def channel_of_key(session_key: str) -> str:
    """``agent:main:telegram:dm:42`` -> ``telegram``; ``agent:main:main`` -> ``main``;
    ``agent:main:dm:42`` (per-peer, no channel in the key) -> ``-``."""
    parts = session_key.split(":")
    if len(parts) < 3:
        return "-"
    return "-" if parts[2] == "dm" else parts[2]
