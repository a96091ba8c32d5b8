-- The memory vector index on PostgreSQL storage (runtime/storage/postgres/memory_index.py;
-- the embedded one is <state_dir>/memory/<agent>/index.sqlite). Per agent: the embedding
-- space (model, dimensions), one unit-length float4 vector per distinct paragraph text
-- (hash = SHA-256 of heading + text: only new or changed paragraphs are embedded), and
-- the current chunks (paragraph hash, scope). rev moves on every change, so each replica
-- knows when its in-memory copy of the vectors is stale.
CREATE TABLE memory_index_meta (
    agent_id text PRIMARY KEY,
    model    text NOT NULL,
    dims     integer,
    rev      bigint NOT NULL DEFAULT 0
);
CREATE TABLE memory_vectors (
    agent_id text NOT NULL,
    hash     text NOT NULL,
    vector   real[] NOT NULL,
    PRIMARY KEY (agent_id, hash)
);
CREATE TABLE memory_chunks (
    agent_id text NOT NULL,
    hash     text NOT NULL,
    scope    text NOT NULL,
    PRIMARY KEY (agent_id, hash, scope)
);
CREATE INDEX memory_chunks_by_scope ON memory_chunks (agent_id, scope);
