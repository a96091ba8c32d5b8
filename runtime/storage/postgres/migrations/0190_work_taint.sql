-- Tainted turns with replicas (gateway/cluster/journal.py ``tainted``; docs/exec.md
-- "Tainted turns"): what tainted a work row's turn ("web_fetch of https://..."), so the
-- replica that re-runs the row after a takeover starts the turn tainted.
ALTER TABLE cluster_work ADD COLUMN IF NOT EXISTS taint text[] NOT NULL DEFAULT '{}';
