-- The OUTCOME event type: the one recorded outcome of every accepted message
-- (docs/outcomes.md). The CHECK of timeline_events (last set by 0121) gains the type.
ALTER TABLE timeline_events DROP CONSTRAINT timeline_events_event_type_check;
ALTER TABLE timeline_events ADD CONSTRAINT timeline_events_event_type_check
    CHECK (event_type IN ('COMPACTION', 'CRON_RUN', 'HEARTBEAT', 'LLM_RESPONSE',
        'MEMORY_FORGET', 'OUTCOME', 'SESSION_CREATE', 'SESSION_END', 'SUBAGENT_ANNOUNCE',
        'SUBAGENT_SPAWN', 'SYSTEM_EVENT', 'TOOL_CALL', 'TOOL_RESULT', 'USER_INPUT'));
