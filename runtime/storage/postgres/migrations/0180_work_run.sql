-- The turn a work row's current attempt runs in (gateway/cluster/crashes.py): the run id
-- its `started` mark (or a side-effecting tool's mark) wrote. Messages merged into one
-- turn share it, so a death with that one turn running is charged to it, as with the
-- intake journal on one host. NULL: written before this column (each row its own turn).
ALTER TABLE cluster_work ADD COLUMN IF NOT EXISTS run_id text;
