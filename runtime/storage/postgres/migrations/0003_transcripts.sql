-- Transcripts (issue 15 "Transcripts on PostgreSQL"; format: runtime/transcript.py): one
-- row per JSONL line, exactly the bytes the embedded backend writes to
-- agents/<agent>/sessions/<session_id>.jsonl (without the trailing newline). seq 0 is the
-- session header; entry_id is the entry's "id" (NULL for the header), so a writer recovers
-- its parentId from the last row. The table is partitioned per agent (one append-only
-- table per agent, created by transcript_partition() when the agent first writes).
CREATE TABLE transcript_lines (
    agent_id   text NOT NULL,
    session_id text NOT NULL,
    seq        bigint NOT NULL CHECK (seq >= 0),
    entry_id   text,
    line       text NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, session_id, seq)
) PARTITION BY LIST (agent_id);

-- Append-only, like the timeline (timeline_refuse() comes from 0002_timeline.sql).
CREATE TRIGGER transcript_lines_no_update BEFORE UPDATE ON transcript_lines
    FOR EACH ROW EXECUTE FUNCTION timeline_refuse('transcript lines are append-only: UPDATE refused');
CREATE TRIGGER transcript_lines_no_delete BEFORE DELETE ON transcript_lines
    FOR EACH ROW EXECUTE FUNCTION timeline_refuse('transcript lines are append-only: DELETE refused');
CREATE TRIGGER transcript_lines_no_truncate BEFORE TRUNCATE ON transcript_lines
    FOR EACH STATEMENT EXECUTE FUNCTION timeline_refuse('transcript lines are append-only: TRUNCATE refused');

-- The agent's partition, created once (two replicas at once: the advisory lock serialises
-- them); returns its table name. TRUNCATE of a partition itself is refused too.
CREATE FUNCTION transcript_partition(agent text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    part text := 'transcripts_' || left(regexp_replace(lower(agent), '[^a-z0-9_]', '_', 'g'), 40)
                 || '_' || left(md5(agent), 8);
BEGIN
    IF to_regclass(quote_ident(part)) IS NOT NULL THEN
        RETURN part;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('tidegate.transcript_partition'));
    IF to_regclass(quote_ident(part)) IS NULL THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF transcript_lines FOR VALUES IN (%L)',
                       part, agent);
        EXECUTE format('CREATE TRIGGER transcript_lines_no_truncate BEFORE TRUNCATE ON %I '
                       'FOR EACH STATEMENT EXECUTE FUNCTION timeline_refuse(%L)', part,
                       'transcript lines are append-only: TRUNCATE refused');
    END IF;
    RETURN part;
END $$;
