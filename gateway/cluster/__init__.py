"""Several gateway replicas on one PostgreSQL (issue 15 "Replicas").

Active only when ``storage.backend`` is ``postgres``; embedded (single host) never imports
it. Everything is coordinated by PostgreSQL itself — transactions, row locks,
``FOR UPDATE SKIP LOCKED``, ``LISTEN/NOTIFY`` and unique constraints; there is no
coordination service of our own:

- ``db``: the connection pool, the LISTEN connection, outage tracking;
- ``membership``: replica heartbeat rows and named leases (accounts, lanes);
- ``work``: the cluster intake journal and work queue (a message reaches the replica that
  runs its session's lane);
- ``accounts``: each channel account runs on exactly one live replica; the others hand
  their replies for it to the owner;
- ``occurrences``: cron's (job, due time) ledger and heartbeat slots;
- ``service``: the per-replica loop that ties them together, and ``status``.
"""
