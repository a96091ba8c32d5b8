-- The reply a work row was delivering when its replica died (gateway/cluster/work.py
-- reply_sending): {text, key, stream, ts}. The replica taking the row over resolves it as
-- a restart on one host resolves a journal entry's reply (gateway/journal/resume.py):
-- a streamed reply gets the cut-off notice, a plain one the per-platform unknown-outcome
-- resend (Discord nonce, Slack lookup, Telegram unconfirmed); nothing is posted twice.
ALTER TABLE cluster_work ADD COLUMN IF NOT EXISTS reply jsonb;
