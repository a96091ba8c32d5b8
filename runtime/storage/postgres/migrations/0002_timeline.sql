-- The timeline (seed 000 §3.3, runtime/timeline): per-session head rows and the
-- append-only, hash-chained events. Same columns as the SQLite timeline.db; content is the
-- canonical JSON text the hash covers (text, not jsonb: the bytes must stay as hashed).
-- seq/prev_hash/hash are assigned by runtime/storage/postgres/timeline.py inside the
-- inserting transaction, with the head row locked (SELECT ... FOR UPDATE).
CREATE TABLE timelines (
    session_id     text PRIMARY KEY,
    session_key    text NOT NULL,
    status         text NOT NULL CHECK (status IN ('active', 'archived')),
    created_at     bigint NOT NULL,
    ended_at       bigint,
    last_seq       bigint NOT NULL,
    last_hash      text NOT NULL,
    last_timestamp bigint NOT NULL,
    created_order  bigint GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX timelines_by_key ON timelines (session_key, created_at);
CREATE TABLE timeline_events (
    event_id   text PRIMARY KEY,
    session_id text NOT NULL,
    seq        bigint NOT NULL,
    "timestamp" bigint NOT NULL,
    event_type text NOT NULL CHECK (event_type IN ('COMPACTION', 'CRON_RUN', 'HEARTBEAT',
        'LLM_RESPONSE', 'SESSION_CREATE', 'SESSION_END', 'SUBAGENT_ANNOUNCE',
        'SUBAGENT_SPAWN', 'SYSTEM_EVENT', 'TOOL_CALL', 'TOOL_RESULT', 'USER_INPUT')),
    content    text NOT NULL,
    prev_hash  text NOT NULL,
    hash       text NOT NULL,
    UNIQUE (session_id, seq)
);

-- Immutability (seed 000: the server database forbids UPDATE and DELETE), as in SQLite.
CREATE FUNCTION timeline_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'restrict_violation';
END $$;
CREATE TRIGGER timeline_events_no_update BEFORE UPDATE ON timeline_events
    FOR EACH ROW EXECUTE FUNCTION timeline_refuse('timeline events are immutable: UPDATE refused');
CREATE TRIGGER timeline_events_no_delete BEFORE DELETE ON timeline_events
    FOR EACH ROW EXECUTE FUNCTION timeline_refuse('timeline events are immutable: DELETE refused');
CREATE TRIGGER timeline_events_no_truncate BEFORE TRUNCATE ON timeline_events
    FOR EACH STATEMENT EXECUTE FUNCTION timeline_refuse('timeline events are immutable: TRUNCATE refused');
CREATE TRIGGER timelines_no_delete BEFORE DELETE ON timelines
    FOR EACH ROW EXECUTE FUNCTION timeline_refuse('timelines are permanent: DELETE refused');
CREATE TRIGGER timelines_no_truncate BEFORE TRUNCATE ON timelines
    FOR EACH STATEMENT EXECUTE FUNCTION timeline_refuse('timelines are permanent: TRUNCATE refused');

CREATE FUNCTION timeline_events_active_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM timelines WHERE session_id = NEW.session_id AND status = 'active';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'timeline is archived or unknown: INSERT refused'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER timeline_events_active_only BEFORE INSERT ON timeline_events
    FOR EACH ROW EXECUTE FUNCTION timeline_events_active_only();

CREATE FUNCTION timelines_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'archived' THEN
        RAISE EXCEPTION 'timeline is archived: UPDATE refused (cannot un-archive)'
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF NEW.last_seq < OLD.last_seq THEN
        RAISE EXCEPTION 'timeline head cannot move backwards' USING ERRCODE = 'restrict_violation';
    END IF;
    IF NEW.session_id IS DISTINCT FROM OLD.session_id
       OR NEW.session_key IS DISTINCT FROM OLD.session_key
       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'timeline identity is permanent: UPDATE refused'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER timelines_guard BEFORE UPDATE ON timelines
    FOR EACH ROW EXECUTE FUNCTION timelines_guard();
