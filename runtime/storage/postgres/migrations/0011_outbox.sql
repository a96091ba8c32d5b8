-- The outbox (runtime/storage/outbox.py): replies waiting for another delivery attempt.
-- owner is the replica that retries the entry; a replica adopts the entries of owners
-- whose heartbeat row (cluster_replicas, migration 0100) is gone or stale.
CREATE TABLE outbox (
    id         text PRIMARY KEY,
    owner      text NOT NULL,
    entry      text NOT NULL,  -- OutboxEntry.to_json
    dead       boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_pending ON outbox (owner) WHERE NOT dead;
