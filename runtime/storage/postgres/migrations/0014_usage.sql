-- The usage ledger (runtime/storage/usage.py): one row per model call.
CREATE TABLE usage_records (
    id     bigserial PRIMARY KEY,
    ts     double precision NOT NULL,  -- epoch s
    record text NOT NULL                -- the JSON line the embedded ledger writes
);
CREATE INDEX usage_records_by_time ON usage_records (ts, id);
