-- Replicas (issue 15 "Replicas"): several gateway processes share one PostgreSQL.
-- Liveness is a heartbeat row; every lease names its holder's replica id and is valid
-- while that replica's heartbeat is younger than cluster.lease_ttl (database time).

CREATE TABLE IF NOT EXISTS cluster_replicas (
    id           text PRIMARY KEY,
    host         text NOT NULL,
    pid          integer NOT NULL,
    port         integer,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    stopped_at   timestamptz
);

-- Named leases: 'account:<channel>:<account>' (who runs the poller/socket/gateway
-- connection) and 'lane:<session key>' (who runs that session's turns).
CREATE TABLE IF NOT EXISTS cluster_leases (
    name        text PRIMARY KEY,
    replica_id  text NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS cluster_leases_replica ON cluster_leases (replica_id);

-- The cluster intake journal and work queue: one row per accepted platform message.
-- dedupe is the inbound exactly-once constraint; target is the replica whose lane runs
-- it; state accepted (routing on the accepting replica) -> queued (waiting for target)
-- -> running -> done.
CREATE TABLE IF NOT EXISTS cluster_work (
    id          bigserial PRIMARY KEY,
    session_key text NOT NULL,
    dedupe      text UNIQUE,
    work        jsonb NOT NULL,
    target      text,
    state       text NOT NULL DEFAULT 'accepted'
                CHECK (state IN ('accepted', 'queued', 'running', 'done')),
    started     boolean NOT NULL DEFAULT false,
    tools       text[] NOT NULL DEFAULT '{}',
    replying    boolean NOT NULL DEFAULT false,
    attempts    integer NOT NULL DEFAULT 0,
    accepted_at timestamptz NOT NULL DEFAULT now(),
    done_at     timestamptz
);
CREATE INDEX IF NOT EXISTS cluster_work_open ON cluster_work (target, id)
    WHERE state <> 'done';

-- Replies for an account whose connection another replica owns: drained by the owner.
CREATE TABLE IF NOT EXISTS cluster_outbound (
    id         bigserial PRIMARY KEY,
    channel    text NOT NULL,
    account    text NOT NULL,
    message    jsonb NOT NULL,
    claimed_by text,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- System events for a session whose lane runs on another replica.
CREATE TABLE IF NOT EXISTS cluster_events (
    id          bigserial PRIMARY KEY,
    target      text NOT NULL,
    session_key text NOT NULL,
    text        text NOT NULL,
    source      text NOT NULL,
    wake        boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Channel connection state that must survive a takeover (Telegram getUpdates offset).
CREATE TABLE IF NOT EXISTS cluster_channel_state (
    name       text PRIMARY KEY,
    value      jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Cron occurrence ledger: each (job, due time) is claimed once cluster-wide.
CREATE TABLE IF NOT EXISTS cluster_cron_runs (
    job_id      text NOT NULL,
    due_at      double precision NOT NULL,
    replica_id  text NOT NULL,
    state       text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done')),
    status      text,
    attempts    integer NOT NULL DEFAULT 1,
    claimed_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (job_id, due_at)
);

-- Heartbeat: one beat per agent per slot (slot = floor(epoch / interval)).
CREATE TABLE IF NOT EXISTS cluster_heartbeat_slots (
    agent_id   text NOT NULL,
    slot       bigint NOT NULL,
    replica_id text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, slot)
);
