-- Exec approvals on replicas (gateway/cluster/approvals.py; docs/exec.md): the requests
-- and the "always allow" patterns are shared, so a press or `tidegate approvals` on any
-- replica decides a request, exactly once (UPDATE ... WHERE status = 'pending'), and
-- NOTIFY tidegate_approvals tells the replica whose turn waits for it. ``replica`` is the
-- replica that waits, or expires it unanswered (taken over when that replica dies).
CREATE TABLE IF NOT EXISTS approval_requests (
    id           text PRIMARY KEY,
    session_key  text NOT NULL,
    command      text NOT NULL,
    replica      text NOT NULL,
    status       text NOT NULL DEFAULT 'pending'
                 CHECK (status IN ('pending', 'allowed', 'denied', 'expired')),
    consumed     boolean NOT NULL DEFAULT false,
    requested_at double precision NOT NULL,
    decided_at   double precision,
    request      jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS approval_requests_open ON approval_requests (session_key, command)
    WHERE NOT consumed;
CREATE INDEX IF NOT EXISTS approval_requests_pending ON approval_requests (replica)
    WHERE status = 'pending';

CREATE TABLE IF NOT EXISTS approval_patterns (
    agent_id   text NOT NULL,
    pattern    text NOT NULL,
    decided_by text NOT NULL,
    at         double precision NOT NULL,
    PRIMARY KEY (agent_id, pattern)
);

-- Messages with buttons for an account another replica runs (RemoteChannel): the owner
-- sends them (state send -> sent with message_id, or failed with error) and later
-- replaces their buttons (close; the row is deleted then), as it drains cluster_outbound.
CREATE TABLE IF NOT EXISTS cluster_buttons (
    id         bigserial PRIMARY KEY,
    channel    text NOT NULL,
    account    text NOT NULL,
    chat       text NOT NULL,
    body       text NOT NULL,
    buttons    jsonb NOT NULL,
    state      text NOT NULL DEFAULT 'send'
               CHECK (state IN ('send', 'sent', 'failed', 'close')),
    message_id text,
    error      text,
    close_text text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS cluster_buttons_todo ON cluster_buttons (channel, account)
    WHERE state IN ('send', 'close');
