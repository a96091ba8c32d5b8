-- Replicas answer `tidegate sessions outcomes` from the shared timeline (the OUTCOME
-- events every replica records): the newest outcomes, without a scan of every event.
CREATE INDEX IF NOT EXISTS timeline_events_outcomes ON timeline_events ("timestamp")
    WHERE event_type = 'OUTCOME';
