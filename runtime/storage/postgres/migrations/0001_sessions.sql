-- The session store (runtime/storage/sessions.py): one row per (agent, session key), the
-- entry record as JSON, as in the embedded sessions.db.
CREATE TABLE sessions (
    agent_id    text NOT NULL,
    session_key text NOT NULL,
    session_id  text NOT NULL,
    entry       jsonb NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, session_key)
);
CREATE INDEX sessions_by_id ON sessions (agent_id, session_id);
