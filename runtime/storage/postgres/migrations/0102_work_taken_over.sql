-- A work row moved off a replica presumed dead (gateway/cluster/work.py take_over): its
-- turn may have begun there, and the user's line is in the transcript before the model
-- is called, so the replica that runs it again looks for the line before writing it.
ALTER TABLE cluster_work ADD COLUMN IF NOT EXISTS taken_over boolean NOT NULL DEFAULT false;
