-- Thread TTL: the thread's own time to live (strategy and minutes, as set by create or patch)
-- and when it runs out. `ttl_swept_at` records when the server's default TTL last trimmed a
-- thread without a TTL of its own (keep_latest), so the next sweep counts from then.
ALTER TABLE threads ADD COLUMN ttl_strategy TEXT CHECK (ttl_strategy IN ('delete', 'keep_latest'));
ALTER TABLE threads ADD COLUMN ttl_minutes REAL;
ALTER TABLE threads ADD COLUMN expires_at TEXT;
ALTER TABLE threads ADD COLUMN ttl_swept_at TEXT;
-- The sweeper's two questions: whose own TTL ran out, and who was idle past the default.
CREATE INDEX threads_by_expiry ON threads (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX threads_by_updated ON threads (updated_at) WHERE ttl_minutes IS NULL;

-- A state update made through the state API is logged for thread streams too, and no run
-- made it: `run_id` becomes optional. SQLite cannot drop NOT NULL in place, so the table is
-- rebuilt (nothing references it).
CREATE TABLE run_events_new (
    thread_id  TEXT NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    run_id     TEXT REFERENCES runs (run_id) ON DELETE CASCADE,
    event      TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (thread_id, seq)
);
INSERT INTO run_events_new (thread_id, seq, run_id, event, data, created_at)
    SELECT thread_id, seq, run_id, event, data, created_at FROM run_events;
DROP TABLE run_events;
ALTER TABLE run_events_new RENAME TO run_events;
CREATE INDEX run_events_by_run ON run_events (run_id, seq);
