"""Store interfaces (DESIGN.md "Storage and scale-out"): every store the gateway keeps sits
behind a small protocol here, with an ``embedded`` backend (files + SQLite, the
zero-config default) and a ``postgres`` backend (``postgres/``, tables in
``postgres/migrations``; ``postgres.stores`` names every backend).

- :mod:`runtime.storage.sessions`: the session store (session key -> entry record).
- :mod:`runtime.storage.transcripts`: session transcripts (OpenClaw-v3 JSONL lines).
- :mod:`runtime.storage.cron`: cron jobs and their run log.
- :mod:`runtime.storage.outbox`: replies waiting for another delivery attempt.
- :mod:`runtime.storage.dedupe`: inbound message keys seen within a TTL.
- :mod:`runtime.storage.pairing`: DM pairing codes and approved senders per channel.
- :mod:`runtime.storage.documents`: small whole-document state (heartbeat delivery
  ledger, auth profile state, Discord catch-up cursors).
- :mod:`runtime.storage.usage`: the usage ledger (one record per model call).
- :mod:`runtime.storage.copy` / ``copy_stores``: ``storage copy`` embedded -> postgres.
"""
