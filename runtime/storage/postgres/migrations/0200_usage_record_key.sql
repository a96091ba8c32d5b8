-- The usage ledger's record key (runtime/storage/postgres/usage.py): each record gets a
-- random key when the gateway makes it, and the write-behind inserts with ON CONFLICT DO
-- NOTHING, so a batch retried after its commit's answer was lost (PostgreSQL stopped,
-- the connection cut) adds no second row for the same model call. Rows written before
-- (and rows copied from the embedded files) have no key; NULLs never conflict.
ALTER TABLE usage_records ADD COLUMN IF NOT EXISTS key text;
CREATE UNIQUE INDEX IF NOT EXISTS usage_records_by_key ON usage_records (key);
