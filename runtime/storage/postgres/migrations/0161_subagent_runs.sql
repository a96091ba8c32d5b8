-- Subagent run records (runtime/subagents/records.py) shared by the replicas: one row per
-- run, written by the replica that runs it, read by every replica and the CLI
-- (`tidegate subagents list|show`, the control API, the session tools).
CREATE TABLE IF NOT EXISTS subagent_runs (
    run_id                text PRIMARY KEY,
    replica_id            text NOT NULL,
    requester_session_key text NOT NULL,
    body                  jsonb NOT NULL,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS subagent_runs_requester ON subagent_runs (requester_session_key);
