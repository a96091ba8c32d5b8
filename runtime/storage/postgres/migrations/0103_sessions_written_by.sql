-- Which replica last wrote a session row whose lane it ran (a fenced write: the lane
-- lease holder, runtime/storage/postgres/fence.py); NULL for a write outside a lane
-- (one host, a heartbeat or cron turn of an unheld session).
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS written_by text;
