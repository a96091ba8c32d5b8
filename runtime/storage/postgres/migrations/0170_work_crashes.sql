-- Dead letters with replicas (gateway/cluster/crashes.py): each attempt of a work row
-- that the process died in is remembered with how far it got (`tool:<name>` or `turn`).
-- The current attempt is what came after the last takeover: `attempt_from` is the number
-- of `tools` entries and `attempts_seen` the `attempts` count at that takeover.
ALTER TABLE cluster_work ADD COLUMN IF NOT EXISTS crashes text[] NOT NULL DEFAULT '{}';
ALTER TABLE cluster_work ADD COLUMN IF NOT EXISTS attempt_from integer NOT NULL DEFAULT 0;
ALTER TABLE cluster_work ADD COLUMN IF NOT EXISTS attempts_seen integer NOT NULL DEFAULT 0;
