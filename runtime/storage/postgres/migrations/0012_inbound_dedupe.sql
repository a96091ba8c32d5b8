-- Inbound dedupe (runtime/storage/dedupe.py): one row per platform message key; the
-- primary key is the cluster-wide "seen before?" check.
CREATE TABLE inbound_seen (
    key     text PRIMARY KEY,
    seen_at double precision NOT NULL  -- epoch s
);
CREATE INDEX inbound_seen_by_time ON inbound_seen (seen_at);
