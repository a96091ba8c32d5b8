-- The check that refuses events for an archived or unknown timeline runs once per
-- statement over its inserted rows (a transition table) instead of once per row: the
-- group commit (runtime/storage/postgres/timeline/batch.py) inserts hundreds of events in
-- one statement, and the row trigger's lookup was half of that statement's time. Same
-- name, same refusal (restrict_violation, the same message); the statement is aborted
-- and nothing of it is written. An AFTER trigger sees the rows the same transaction's
-- earlier statements created (a new timeline) and the status before SESSION_END's
-- archiving, which runs after the events (runtime/storage/postgres/timeline/).
CREATE FUNCTION timeline_events_active_only_stmt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows n LEFT JOIN timelines t
               ON t.session_id = n.session_id AND t.status = 'active'
               WHERE t.session_id IS NULL) THEN
        RAISE EXCEPTION 'timeline is archived or unknown: INSERT refused'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER timeline_events_active_only ON timeline_events;
CREATE TRIGGER timeline_events_active_only AFTER INSERT ON timeline_events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION timeline_events_active_only_stmt();
