-- Lease fencing (issue 15 "Replicas"; gateway/cluster/fencing.py): every acquisition of a
-- lease by a new holder draws a new generation from one sequence, so a replica that lost
-- a lease (paused, partitioned) and presents its old generation is refused even if the
-- lease came back to it later. Writes that matter check it in their own statement.
CREATE SEQUENCE IF NOT EXISTS cluster_lease_generation;
ALTER TABLE cluster_leases ADD COLUMN IF NOT EXISTS generation bigint NOT NULL
    DEFAULT nextval('cluster_lease_generation');
-- Who last wrote a channel state value (the Telegram offset): the account's owner.
ALTER TABLE cluster_channel_state ADD COLUMN IF NOT EXISTS written_by text;
