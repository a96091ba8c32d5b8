-- Cron jobs and their run log (runtime/storage/cron.py), shared by every replica.
-- One row per job, its job_to_dict JSON as text (byte-identical to a jobs.json line).
-- position keeps insertion order; rev moves on every write (replicas poll max(rev) to
-- notice a change they missed a NOTIFY for); a removed job stays as a tombstone so a
-- replica that has not seen the removal yet cannot write it back.
CREATE SEQUENCE cron_jobs_position;
CREATE SEQUENCE cron_jobs_rev;
CREATE TABLE cron_jobs (
    job_id     text PRIMARY KEY,
    position   bigint NOT NULL DEFAULT nextval('cron_jobs_position'),
    job        text NOT NULL,
    defined_at double precision NOT NULL,  -- the job's updated_at (epoch s)
    removed    boolean NOT NULL DEFAULT false,
    rev        bigint NOT NULL DEFAULT nextval('cron_jobs_rev'),
    saved_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE cron_runs (
    id       bigserial PRIMARY KEY,
    job_id   text NOT NULL,
    record   text NOT NULL,
    added_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX cron_runs_by_job ON cron_runs (job_id, id);
