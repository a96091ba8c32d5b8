-- transcript_partition() (0003) again, safe when several replicas create an agent's
-- partition at the same instant: the loser of the race finds the table created (the
-- catalog check inside the function could miss a concurrent commit: DuplicateTable).
CREATE OR REPLACE FUNCTION transcript_partition(agent text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    part text := 'transcripts_' || left(regexp_replace(lower(agent), '[^a-z0-9_]', '_', 'g'), 40)
                 || '_' || left(md5(agent), 8);
BEGIN
    IF to_regclass(quote_ident(part)) IS NOT NULL THEN
        RETURN part;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('tidegate.transcript_partition'));
    BEGIN
        EXECUTE format('CREATE TABLE %I PARTITION OF transcript_lines FOR VALUES IN (%L)',
                       part, agent);
        EXECUTE format('CREATE TRIGGER transcript_lines_no_truncate BEFORE TRUNCATE ON %I '
                       'FOR EACH STATEMENT EXECUTE FUNCTION timeline_refuse(%L)', part,
                       'transcript lines are append-only: TRUNCATE refused');
    EXCEPTION WHEN duplicate_table OR unique_violation THEN
        NULL;  -- created by a concurrent call
    END;
    RETURN part;
END $$;
