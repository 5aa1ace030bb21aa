-- Runs: the queue workers claim from (FOR UPDATE SKIP LOCKED).
CREATE TABLE runs (
    run_id             UUID PRIMARY KEY,
    thread_id          UUID NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
    assistant_id       UUID NOT NULL,
    user_id            TEXT,
    status             TEXT NOT NULL DEFAULT 'pending',
    kwargs             JSONB NOT NULL DEFAULT '{}',
    metadata           JSONB NOT NULL DEFAULT '{}',
    multitask_strategy TEXT NOT NULL DEFAULT 'enqueue',
    -- 0 until claimed; +1 at every claim.
    attempt            INTEGER NOT NULL DEFAULT 0,
    -- Not claimed before this time (after_seconds).
    run_after          TIMESTAMPTZ NOT NULL,
    -- Someone asked the run to stop: NULL, 'interrupt' or 'rollback'.
    cancel             TEXT CHECK (cancel IN ('interrupt', 'rollback')),
    lease_owner        TEXT,
    lease_expires_at   TIMESTAMPTZ,
    error              JSONB,
    created_at         TIMESTAMPTZ NOT NULL,
    updated_at         TIMESTAMPTZ NOT NULL
);
-- At most one running run per thread: the database, not a map in memory, keeps a thread's
-- runs from overlapping.
CREATE UNIQUE INDEX runs_one_running_per_thread ON runs (thread_id) WHERE status = 'running';
-- Claiming: due pending runs, oldest first; expired leases of running runs.
CREATE INDEX runs_to_claim ON runs (status, run_after, created_at);
CREATE INDEX runs_by_lease ON runs (lease_expires_at) WHERE status = 'running';
-- Listing a thread's runs, newest first.
CREATE INDEX runs_by_thread ON runs (thread_id, created_at DESC);

-- The event log: every event of a run, numbered per thread. Deleted with its thread and
-- with its run.
CREATE TABLE run_events (
    thread_id  UUID NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
    seq        BIGINT NOT NULL,
    run_id     UUID NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    event      TEXT NOT NULL,
    -- json, not jsonb: kept as written (key order included, since serde_json preserves it),
    -- so a replayed event is byte for byte the live one, and no jsonb conversion per write.
    data       JSON NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (thread_id, seq)
);
-- Also what the cascade from runs deletes by.
CREATE INDEX run_events_by_run ON run_events (run_id, seq);
