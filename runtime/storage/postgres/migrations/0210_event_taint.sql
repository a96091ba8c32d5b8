-- Tainted system events with replicas (gateway/cluster/service.py ``enqueue_event``;
-- docs/exec.md "Tainted turns"): what tainted the turn behind an event handed to the
-- replica that runs its session's lane (a background command a stranger's turn started,
-- a tainted subagent run's result), so the turn that drains it there is tainted too.
ALTER TABLE cluster_events ADD COLUMN IF NOT EXISTS taint text[] NOT NULL DEFAULT '{}';
