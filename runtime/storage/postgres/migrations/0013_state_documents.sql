-- Whole-document stores (runtime/storage/documents.py): the heartbeat delivery ledger,
-- the auth profile state, ... one row per document name.
CREATE TABLE state_documents (
    name       text PRIMARY KEY,
    body       bytea NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
