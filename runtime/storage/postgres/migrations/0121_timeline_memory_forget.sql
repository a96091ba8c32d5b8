-- MEMORY_FORGET: a deletion of memory entries (who, which scope, which entry ids; never
-- the deleted text) is a timeline event. The CHECK of timeline_events gains the type.
ALTER TABLE timeline_events DROP CONSTRAINT timeline_events_event_type_check;
ALTER TABLE timeline_events ADD CONSTRAINT timeline_events_event_type_check
    CHECK (event_type IN ('COMPACTION', 'CRON_RUN', 'HEARTBEAT', 'LLM_RESPONSE',
        'MEMORY_FORGET', 'SESSION_CREATE', 'SESSION_END', 'SUBAGENT_ANNOUNCE',
        'SUBAGENT_SPAWN', 'SYSTEM_EVENT', 'TOOL_CALL', 'TOOL_RESULT', 'USER_INPUT'));
