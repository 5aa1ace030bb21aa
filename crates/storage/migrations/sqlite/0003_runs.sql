-- Runs: the queue workers claim from. Timestamps are RFC 3339 text in UTC, as sqlx writes
-- them, so they compare correctly as strings.
CREATE TABLE runs (
    run_id             TEXT PRIMARY KEY NOT NULL,
    thread_id          TEXT NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
    assistant_id       TEXT NOT NULL,
    user_id            TEXT,
    status             TEXT NOT NULL DEFAULT 'pending',
    kwargs             TEXT NOT NULL DEFAULT '{}',
    metadata           TEXT NOT NULL DEFAULT '{}',
    multitask_strategy TEXT NOT NULL DEFAULT 'enqueue',
    -- 0 until claimed; +1 at every claim.
    attempt            INTEGER NOT NULL DEFAULT 0,
    -- Not claimed before this time (after_seconds).
    run_after          TEXT NOT NULL,
    -- Someone asked the run to stop: NULL, 'interrupt' or 'rollback'.
    cancel             TEXT CHECK (cancel IN ('interrupt', 'rollback')),
    lease_owner        TEXT,
    lease_expires_at   TEXT,
    error              TEXT,
    created_at         TEXT NOT NULL,
    updated_at         TEXT NOT NULL
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
    thread_id  TEXT NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    run_id     TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    event      TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (thread_id, seq)
);
-- Also what the cascade from runs deletes by.
CREATE INDEX run_events_by_run ON run_events (run_id, seq);
