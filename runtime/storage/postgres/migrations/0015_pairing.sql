-- DM pairing (runtime/storage/pairing.py): one JSON document per channel, shared by
-- every replica and the CLI; rev moves on every write (readers' change check).
CREATE TABLE pairing (
    channel    text PRIMARY KEY,
    body       bytea,           -- NULL: a row locked for a first write that never came
    rev        bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
